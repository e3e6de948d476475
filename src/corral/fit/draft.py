"""The draft model of ``speculative = "draft"``, as both sides see it: its file, the settings
it runs with, and its memory on each GPU (weights of its GPU layers + its KV cache + compute,
by ``corral.fit.plan``'s math). The router adds it to a model's estimated need before placing
an instance (``corral.control.placement.gpus``); the worker keeps that much out of the main model's
``n_gpu_layers = "auto"`` plan (``worker/speculation/draft.py``), so both fit on the GPU they share.

Imports only ``corral.model.settings``, ``corral.fit.layout``, ``corral.fit.plan`` and ``corral.fit.split`` (leaves both sides use).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from corral.fit.layout import GGUFError, ModelLayout, read_layout
from corral.fit.plan import device_needs
from corral.fit.split import split_by_weights
from corral.model.settings import ModelSettings

__all__ = ["draft_path", "draft_settings", "draft_needs"]


def draft_path(s: ModelSettings, model_path: str | Path) -> Path | None:
    """The draft GGUF of a model with ``speculative = "draft"`` (a relative ``draft_model``
    is taken from the model file's folder); None for any other model."""
    if s.speculative != "draft" or not s.draft_model:
        return None
    p = Path(s.draft_model).expanduser()
    return p if p.is_absolute() else Path(model_path).parent / p


def draft_settings(s: ModelSettings) -> ModelSettings:
    """The settings the draft runs with: the model's own (slots, context per slot, batch,
    KV cache types, split), with ``draft_n_gpu_layers`` (None: all layers where the model
    has GPU layers, else none), and whole sliding windows (a rolled-back draft never costs
    a cell: worker/speculation/draft.py)."""
    ngl = s.draft_n_gpu_layers
    if ngl is None:
        ngl = 0 if s.n_gpu_layers == 0 else -1
    fields = s.to_dict()
    fields.update(n_gpu_layers=ngl, speculative="off", draft_model=None, swa_full=True)
    return ModelSettings(**fields)


def draft_needs(s: ModelSettings, model_path: str | Path, *, budgets: Sequence[int],
                free: Sequence[int] | None = None,
                read: Callable[[Path], ModelLayout] = read_layout) -> list[int]:
    """The draft's need on each of the GPUs with these ``budgets`` (0 each without a draft;
    a file that is not readable GGUF: its size, split like the layers); ``read``: how its
    layout is read (the router's is cached by file: control/placement/gpus.py)."""
    path = draft_path(s, model_path)
    if path is None:
        return [0] * len(budgets)
    try:
        layout = read(path)
    except (GGUFError, OSError, ValueError):
        try:
            size = path.stat().st_size
        except OSError:
            return [0] * len(budgets)
        return split_by_weights(size, list(free or budgets))
    return device_needs(layout, draft_settings(s), budgets=budgets, free=free)
