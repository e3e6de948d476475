"""llama.cpp's own model cache as a source of models: what ``llama-server -hf`` (and
``llama-cli -hf``) downloaded, in ``$LLAMA_CACHE`` (default ``$XDG_CACHE_HOME/llama.cpp``,
``~/.cache/llama.cpp``), is listed like the models corral pulled, and served in place.

llama.cpp keeps, per pulled ``owner/repo:TAG``, a manifest ``manifest=owner=repo=TAG.json``
(the Hub's answer: ``ggufFile.rfilename``, ``mmprojFile.rfilename``) and the files as
``owner_repo_<file name>``. Such a model's id is the name it was pulled by, as llama.cpp's
router lists it (``owner/repo:TAG``; ``owner/repo`` for ``latest``); a ``.gguf`` no manifest
names gets its file stem, as in ``models_dir``. corral never writes or deletes there.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from corral.model.ids import id_problem

__all__ = ["llama_cache_dir", "CachedModel", "cached_models"]

_MAX_MANIFEST_BYTES = 1 << 20


def llama_cache_dir() -> Path:
    """``$LLAMA_CACHE``, else llama.cpp's default on this system."""
    env = os.environ.get("LLAMA_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "llama.cpp"


class CachedModel:
    __slots__ = ("id", "path", "mmproj")

    def __init__(self, model_id: str, path: Path, mmproj: Path | None) -> None:
        self.id = model_id
        self.path = path
        self.mmproj = mmproj


def _local_name(owner: str, repo: str, rfilename: str) -> str:
    return f"{owner}_{repo}_{rfilename.replace('/', '_')}"


def _manifest(path: Path) -> tuple[str, Path, Path | None] | None:
    """(id, model file, projector) of one manifest; None for one that names no file here."""
    parts = path.name.removesuffix(".json").split("=")
    if len(parts) != 4 or parts[0] != "manifest":
        return None
    _, owner, repo, tag = parts
    try:
        if path.stat().st_size > _MAX_MANIFEST_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        gguf = data["ggufFile"]["rfilename"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(gguf, str):
        return None
    file = path.parent / _local_name(owner, repo, gguf)
    if not file.is_file():
        return None
    proj = data.get("mmprojFile")
    mmproj = None
    if isinstance(proj, dict) and isinstance(proj.get("rfilename"), str):
        candidate = path.parent / _local_name(owner, repo, proj["rfilename"])
        mmproj = candidate if candidate.is_file() else None
    model_id = f"{owner}/{repo}" if tag == "latest" else f"{owner}/{repo}:{tag}"
    return model_id, file, mmproj


def cached_models(root: Path, id_of_file: Callable[[str], str]) -> list[CachedModel]:
    """The models in llama.cpp's cache ``root``, by id (``id_of_file``: a loose file's id
    from its name, as ``models_dir``'s)."""
    if not root.is_dir():
        return []
    out: dict[str, CachedModel] = {}
    named: set[Path] = set()
    for mf in sorted(root.glob("manifest=*.json")):
        got = _manifest(mf)
        if got is None or id_problem(got[0]) is not None:
            continue
        mid, file, mmproj = got
        named.update(p for p in (file, mmproj) if p is not None)
        out.setdefault(mid, CachedModel(mid, file, mmproj))
    for f in sorted(root.glob("*.gguf")):
        if f in named or "mmproj" in f.name.lower() or not f.is_file():
            continue
        mid = id_of_file(f.name)
        out.setdefault(mid, CachedModel(mid, f, None))
    return [out[k] for k in sorted(out)]
