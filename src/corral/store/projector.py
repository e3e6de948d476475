"""A model's multimodal projector (llama-server's ``--mmproj``): which file, if any.

The rule, in order:

1. the model's ``mmproj`` setting: a path (relative paths resolve against the config
   file's directory, like the model's ``path``); ``mmproj = ""`` means none (no search);
2. a projector pulled with the model (the store's manifest names it);
3. next to the model file: a ``*.gguf`` in the same directory whose name contains
   ``mmproj`` (llama.cpp's and the Hub's naming: ``mmproj-model-f16.gguf``,
   ``mmproj-<model>-f16.gguf``, ``<model>.mmproj.gguf``). When the directory holds one
   model, every such file is its; when it holds several, a projector file belongs to the
   model whose file stem its name contains (the longest such stem wins, so
   ``mmproj-foo-bar.gguf`` is ``foo-bar``'s, not ``foo``'s). Several candidates: the first by
   name.

Only the router uses this (to fill in a spec's ``mmproj``); the worker loads what it is told.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["is_projector_name", "find_projector", "projector_for"]


def is_projector_name(name: str) -> bool:
    low = name.lower()
    return low.endswith(".gguf") and "mmproj" in low


def _stem(name: str) -> str:
    return name[:-5].lower() if name.lower().endswith(".gguf") else name.lower()


def find_projector(model_path: Path) -> Path | None:
    """The projector next to ``model_path`` by the naming rule above (3.), or None."""
    folder = model_path.parent
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_file())
    except OSError:
        return None
    projectors = [n for n in names if is_projector_name(n)]
    if not projectors:
        return None
    models = [_stem(n) for n in names if n.lower().endswith(".gguf") and not is_projector_name(n)]
    mine = _stem(model_path.name)
    if len(models) <= 1:
        return folder / projectors[0]
    for name in projectors:
        owners = [m for m in models if m in name.lower()]
        if owners and max(owners, key=len) == mine:
            return folder / name
    return None


def projector_for(model_path: Path, setting: str | None, pulled: Path | None = None) -> Path | None:
    """The projector a model loads with: its ``mmproj`` setting ("" is none), else the one
    pulled with it, else one found next to its file."""
    if setting is not None:
        return Path(setting) if setting else None
    if pulled is not None:
        return pulled
    return find_projector(Path(model_path))
