"""Which model files a request may make the server read, load or delete.

A request can name a file in several ways: a model id (a file in ``models_dir``), a
Nitro ``llama_model_path``, a pull target, ``DELETE /models/{id}``. Every such path is
resolved (symlinks followed, ``..`` removed) *without* touching the file first, and
must then lie inside one of:

- ``models_dir`` (``[server] models_dir``),
- a directory of ``[server] allowed_model_dirs``,
- the Hugging Face hub cache (pulled models are used in place there),

or be one of the files the operator named: the embedded default model and the
``path`` of every ``[models.ID]`` table. Anything else is refused with 403
``path_not_allowed`` naming the setting that allows it; the refusal is the same
whether the file exists or not, so a client learns nothing about files outside.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from corral.errors import InvalidRequest, PathNotAllowed

__all__ = ["PathPolicy", "hf_hub_cache_dir", "real_path"]

_MAX_PATH_CHARS = 4096


def hf_hub_cache_dir() -> Path:
    """Where huggingface_hub keeps its cache (same rules, without importing it)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "huggingface" / "hub"


def real_path(path: str | os.PathLike[str], *, param: str = "path") -> Path:
    """The path with ``~`` expanded and symlinks and ``..`` resolved; no file is opened.
    Paths that cannot name a file (NUL bytes, absurd length) are a 400."""
    text = os.fspath(path)
    if "\x00" in text:
        raise InvalidRequest(f"{param}: a path must not contain NUL bytes", param=param)
    if len(text) > _MAX_PATH_CHARS:
        raise InvalidRequest(f"{param}: a path of {len(text)} characters is too long "
                             f"(at most {_MAX_PATH_CHARS})", param=param)
    try:
        return Path(os.path.realpath(os.path.expanduser(text)))
    except (OSError, ValueError, RuntimeError):
        raise InvalidRequest(f"{param}: not a usable file path", param=param) from None


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


class PathPolicy:
    """The roots and files a request may reach (see the module doc)."""

    def __init__(self, models_dir: Path | None, allowed_dirs: Iterable[Path] = (),
                 allowed_files: Iterable[Path] = (), *, hf_cache: bool = True) -> None:
        roots = [models_dir] if models_dir is not None else []
        roots += list(allowed_dirs)
        if hf_cache:
            roots.append(hf_hub_cache_dir())
        self.roots = [real_path(r) for r in roots]
        self.files = {real_path(f) for f in allowed_files}

    def allows(self, path: str | os.PathLike[str]) -> bool:
        try:
            rp = real_path(path)
        except InvalidRequest:
            return False
        return rp in self.files or any(_inside(rp, root) for root in self.roots)

    def check(self, path: str | os.PathLike[str], *, param: str) -> Path:
        """The resolved path, or 403 path_not_allowed (400 for a path that cannot be one)."""
        rp = real_path(path, param=param)
        if rp in self.files or any(_inside(rp, root) for root in self.roots):
            return rp
        raise PathNotAllowed(
            f"{param}: {os.fspath(path)!r} is outside the models directory and the allowed "
            "directories; to serve models from there, add the directory to [server] "
            "allowed_model_dirs in the config (or put the file in models_dir)",
            param=param)
