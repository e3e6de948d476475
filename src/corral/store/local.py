"""The model store on disk: which GGUF models this machine has.

Layout (``models_dir``, default ``$CORRAL_MODELS_DIR`` or ``~/.local/share/corral/models``)::

    models_dir/
      any/sub/dir/name.gguf            a loose model: id = file stem ("name")
      <stem>.gguf                      a pulled model (placed here once verified)
      .corral/manifests/<stem>.json    pulled models: id, source, sha256, path, size
                                       (<stem> = corral.model.ids.file_stem(id): an id
                                       such as owner/repo:Q4_K_M never becomes a path)
                                       (path may point into the user's HF cache)
      .corral/partial/<key>.part       downloads in progress or interrupted; never listed
      .corral/partial/<key>.json       what the partial file is (url, size, sha256, etag)

A symlink (or a manifest) whose file lies outside ``models_dir`` is listed only when
``may_serve`` allows it (the router passes ``corral.store.confine.PathPolicy.allows``:
``[server] allowed_model_dirs`` and the HF cache), so a link cannot lead requests out.
Deleting a model removes its directory entry (a symlink itself, never what it points to).

A model appears in ``list()`` only when its file is complete: pulls write to
``partial/``, verify, fsync and rename into place, and write the manifest last.
Files named ``*mmproj*`` (vision projectors) are not models on their own and are skipped.

Every listed file's header is checked (``corral.store.gguf.check_file``: cached per file
version, blocking, so the router lists off its event loop). A file that does not read as
GGUF (truncated, crafted, a symlink loop) is still listed, with ``problem`` saying why: the
router shows it as a ``failed`` model and it can be deleted; it never hides its neighbours.

With ``llama_cache``, the models of llama.cpp's own cache (corral.store.llama_cache) are
listed too, under ids the store does not have (source ``llama.cpp cache``); they are served
in place and never deleted by corral.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from corral.errors import InvalidRequest, ModelNotFound
from corral.model.ids import file_stem, id_from_file_stem, id_problem
from corral.store.gguf import check_file, quant_from_name
from corral.store.llama_cache import cached_models
from corral.store.redaction import redact_url

__all__ = [
    "LocalModel",
    "ModelStore",
    "default_models_dir",
    "validate_model_id",
    "model_id_from_filename",
    "LLAMA_CACHE_SOURCE",
]

log = logging.getLogger("corral.store")
LLAMA_CACHE_SOURCE = "llama.cpp cache"  # a listed model's source when it is in llama.cpp's cache
_META = ".corral"


def default_models_dir() -> Path:
    env = os.environ.get("CORRAL_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "corral" / "models"


def validate_model_id(model_id: str, *, param: str = "id") -> str:
    """The id itself, or InvalidRequest saying what is wrong (rules: corral.model.ids)."""
    problem = id_problem(model_id)
    if problem is None and model_id.lower().endswith(".gguf"):
        problem = "a model id does not end with .gguf (that is the file's name)"
    if problem is not None:
        raise InvalidRequest(f"invalid model id {model_id!r}: {problem}", param=param)
    return model_id


def model_id_from_filename(name: str) -> str:
    """``Llama-3.2-1B-Instruct-Q4_K_M.gguf`` -> ``Llama-3.2-1B-Instruct-Q4_K_M``; a file
    whose name is ``file_stem(id)`` of an id (a pulled model's file) -> that id."""
    stem = Path(name).name
    if stem.lower().endswith(".gguf"):
        stem = stem[:-5]
    decoded = id_from_file_stem(stem)
    if decoded is not None:
        return decoded
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")[:128]
    return stem or "model"


@dataclass(frozen=True, slots=True)
class LocalModel:
    id: str
    path: Path
    size: int
    quantization: str | None
    source: str | None  # where it was pulled from; None for a loose file
    sha256: str | None  # known for pulled models; None for loose files (not hashed)
    mmproj: Path | None = None  # the vision projector pulled with it (corral.store.projector)
    problem: str | None = None  # why its file does not read as GGUF (listed, status "failed")

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "path": str(self.path),
            "size": self.size,
            "quantization": self.quantization,
            "source": self.source,
            "sha256": self.sha256,
            "mmproj": str(self.mmproj) if self.mmproj else None,
            "problem": self.problem,
        }


def _model(model_id: str, path: Path, size: int, *, source: str | None = None, sha256: str | None = None,
           mmproj: Path | None = None) -> LocalModel:
    """A model as listed: its header checked (``corral.store.gguf.check_file``, cached)."""
    check = check_file(path)
    return LocalModel(model_id, path, size, check.quantization or quant_from_name(path.name), source, sha256,
                      mmproj, check.problem)


class ModelStore:
    """Reads the directory on every call: files a user drops in show up at once."""

    def __init__(self, root: Path, may_serve: Callable[[Path], bool] | None = None,
                 llama_cache: Path | None = None) -> None:
        self.root = Path(root).expanduser()
        self.may_serve = may_serve
        self.llama_cache = llama_cache
        self._warned: set[Path] = set()

    def _reachable(self, path: Path) -> bool:
        """False for a file outside models_dir (through a symlink or a manifest) that
        ``may_serve`` does not allow."""
        if self.may_serve is None:
            return True
        try:
            real = Path(os.path.realpath(path))
            if real.is_relative_to(Path(os.path.realpath(self.root))):
                return True
        except (OSError, ValueError):
            return False
        if self.may_serve(path):
            return True
        if path not in self._warned:
            self._warned.add(path)
            log.warning("not serving %s: it leads to %s, outside the models dir; add that "
                        "directory to [server] allowed_model_dirs to serve it", path, real)
        return False

    # ----------------------------------------------------------------- paths
    @property
    def meta_dir(self) -> Path:
        return self.root / _META

    @property
    def manifests_dir(self) -> Path:
        return self.meta_dir / "manifests"

    @property
    def partial_dir(self) -> Path:
        return self.meta_dir / "partial"

    def manifest_path(self, model_id: str) -> Path:
        """The manifest's file: named by ``file_stem(id)``, never by the id itself."""
        return self.manifests_dir / f"{file_stem(model_id)}.json"

    def model_file_path(self, model_id: str) -> Path:
        """Where a pulled model's file goes (``file_stem(id)``: no '/', no traversal)."""
        return self.root / f"{file_stem(model_id)}.gguf"

    def projector_file_path(self, model_id: str) -> Path:
        """Where the vision projector pulled with a model goes (found next to it by name)."""
        return self.root / f"{file_stem(model_id)}.mmproj.gguf"

    def ensure_dirs(self) -> None:
        self.manifests_dir.mkdir(parents=True, exist_ok=True)
        self.partial_dir.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------- reading
    def _manifests(self) -> dict[str, LocalModel]:
        out: dict[str, LocalModel] = {}
        if not self.manifests_dir.is_dir():
            return out
        for mf in sorted(self.manifests_dir.glob("*.json")):
            try:
                data = json.loads(mf.read_text())
                path = Path(data["path"])
                size = path.stat().st_size
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a manifest whose file is gone or unreadable lists nothing
            if not path.is_file() or not self._reachable(path):
                continue
            mid = data.get("id") if isinstance(data.get("id"), str) else mf.stem
            if id_problem(mid) is not None or file_stem(mid) != mf.stem:
                continue  # not a manifest corral wrote for that id
            out[mid] = _model(mid, path, size, source=_shown_source(data.get("source")), sha256=data.get("sha256"),
                              mmproj=self._projector(data))
        return out

    def _projector(self, manifest: dict[str, object]) -> Path | None:
        proj = manifest.get("mmproj")
        path = Path(str(proj["path"])) if isinstance(proj, dict) and proj.get("path") else None
        return path if path is not None and path.is_file() and self._reachable(path) else None

    def _loose(self, taken: set[Path]) -> dict[str, LocalModel]:
        out: dict[str, LocalModel] = {}
        if not self.root.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if d != _META and not d.startswith("."))
            for name in sorted(filenames):
                if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
                    continue
                path = Path(dirpath) / name
                if path in taken:
                    continue
                mid = model_id_from_filename(name)
                if mid in out or not self._reachable(path):
                    continue  # the same stem twice: the first (sorted) wins
                try:
                    size = path.stat().st_size
                except FileNotFoundError:
                    continue  # gone meanwhile, or a link to nothing
                except OSError:  # a symlink loop: listed, failed (check_file says why)
                    size = 0
                out[mid] = _model(mid, path, size)
        return out

    def list(self) -> list[LocalModel]:
        manifests = self._manifests()
        loose = self._loose({m.path for m in manifests.values()})
        merged = {**loose, **manifests}  # a manifest wins over a loose file of that id
        for c in cached_models(self.llama_cache, model_id_from_filename) if self.llama_cache else []:
            if c.id in merged:
                continue
            try:
                size = c.path.stat().st_size
            except OSError:
                continue
            merged[c.id] = _model(c.id, c.path, size, source=LLAMA_CACHE_SOURCE, mmproj=c.mmproj)
        return [merged[k] for k in sorted(merged)]

    def get(self, model_id: str) -> LocalModel | None:
        for m in self.list():
            if m.id == model_id:
                return m
        return None

    # ----------------------------------------------------------------- writing
    def write_manifest(self, model_id: str, *, path: Path, source: str, sha256: str | None,
                       size: int, projector: Mapping[str, object] | None = None) -> LocalModel:
        """Record a pulled model (``projector``: the vision projector pulled with it, as
        {path, sha256, size}). Written to a temp file and renamed: atomic."""
        validate_model_id(model_id)
        self.ensure_dirs()
        target = self.manifest_path(model_id)
        tmp = target.with_suffix(".json.tmp")
        source = redact_url(source)  # a pull URL's password is nobody's to read back
        text = json.dumps({"id": model_id, "path": str(path), "source": source, "sha256": sha256,
                           "size": size, **({"mmproj": dict(projector)} if projector else {})}, indent=2)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
        os.replace(tmp, target)
        proj = Path(str(projector["path"])) if projector else None
        return _model(model_id, path, size, source=source, sha256=sha256, mmproj=proj)

    def remove(self, model_id: str) -> LocalModel:
        """Delete a model. A pulled file inside ``models_dir`` is deleted; a file in the
        user's Hugging Face cache is left there (only the manifest goes)."""
        model = self.get(model_id)
        if model is None:
            raise ModelNotFound(f"model {model_id!r} is not in the store ({self.root})",
                                param="model")
        if model.source == LLAMA_CACHE_SOURCE:
            raise InvalidRequest(f"model {model_id!r} is in llama.cpp's cache ({self.llama_cache}); corral "
                                 "does not delete there (remove it with llama.cpp's tools)", param="model")
        mf = self.manifest_path(model_id)
        try:  # the directory entry is ours when its directory is inside models_dir
            inside = model.path.parent.resolve().is_relative_to(self.root.resolve())
        except OSError:
            inside = False
        if inside:
            model.path.unlink(missing_ok=True)  # a symlink: the link goes, not its target
        if model.mmproj is not None and model.mmproj.parent.resolve() == self.root.resolve():
            model.mmproj.unlink(missing_ok=True)  # the projector pulled with it, ours in models_dir
        mf.unlink(missing_ok=True)
        return model


def _shown_source(source: object) -> str | None:
    """A manifest's source as lists show it (a manifest written before redaction may hold a
    pull URL's password)."""
    return redact_url(source) if isinstance(source, str) else None
