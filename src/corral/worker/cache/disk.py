"""The prompt cache on disk, for one worker: its model key, the index of its model's files,
the reads at admission and the writes at unload (files: ``corral.state.cache_files``).

The model key says which KV a file may be restored into: the model file's identity and every
load setting that changes what the KV holds or how a sequence's state is laid out. A file
under another key is never read (its directory is another one); a file whose header names
another key, or whose checksum fails, is dropped with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

from corral import wire

from corral.state import cache_files
from corral.state.cache_files import CacheFile, CacheFileError
from corral.worker.model import LoadedModel

__all__ = ["model_key", "file_identity", "DiskCache", "Candidate"]

log = logging.getLogger("corral.worker.cache.prompt_cache")

KEY_FORMAT = 1
_HEAD_BYTES = 1 << 20  # the file identity hashes its first and last MiB


def file_identity(path: str) -> dict[str, object]:
    """What identifies a model file without reading it all: its size, the sha256 of its
    first and last MiB (the GGUF header, metadata and the last tensors), and the whole
    file's sha256 where the store recorded it when it pulled the file (its manifest,
    ``models_dir/.corral/manifests/<stem>.json``), else its mtime."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_HEAD_BYTES))
        if st.st_size > 2 * _HEAD_BYTES:
            f.seek(st.st_size - _HEAD_BYTES)
        h.update(f.read(_HEAD_BYTES))
    out: dict[str, object] = {"size": st.st_size, "head_tail_sha256": h.hexdigest()}
    sha = _store_sha256(Path(path), st.st_size)
    if sha is not None:
        out["sha256"] = sha
    else:
        out["mtime_ns"] = st.st_mtime_ns
    return out


def _store_sha256(path: Path, size: int) -> str | None:
    """The sha256 the store's manifest gives this file (same path and size), or None."""
    manifest = path.parent / ".corral" / "manifests" / f"{path.stem}.json"
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sha = data.get("sha256") if isinstance(data, dict) else None
    if not isinstance(sha, str) or len(sha) != 64 or data.get("size") != size or \
            Path(str(data.get("path", ""))).resolve() != path.resolve():
        return None
    return sha.lower()


def model_key(m: LoadedModel, s: wire.WorkerSettings) -> str:
    """The identity a saved KV state is valid under (a hex digest).

    ``lora``: the model's adapter files in their order (an entry's adapter set names them by
    index; the set itself is in each entry: ``CacheFile.lora``); images are part of the
    tokens' meaning and are keyed with the tokens instead."""
    fields: dict[str, object] = {
        "format": KEY_FORMAT,
        "llama_cpp": getattr(ll, "__version__", ""),  # the state's byte layout
        "file": file_identity(s.model_path),
        "n_ctx": m.n_ctx, "n_ctx_slot": m.n_ctx_slot, "n_slots": m.n_slots,
        "n_batch": m.n_batch, "n_ubatch": int(ll.llama_n_ubatch(m.ctx)),  # SWA layers keep n_swa + n_ubatch
        "cache_type_k": s.cache_type_k, "cache_type_v": s.cache_type_v,
        "flash_attn": s.flash_attn, "kv_unified": s.speculative != "off", "swa_full": s.swa_full,
        "n_swa": m.n_swa, "gpu_layers": m.info.gpu_layers,
        "rope": None,  # no rope/yarn settings yet: their fields go here when added
        # the adapter files an entry's set (its indices) refers to: a replaced file is another key
        "lora": [{"path": a.path, "file": file_identity(a.path) if os.path.isfile(a.path) else None}
                 for a in s.lora],
        "mmproj": file_identity(s.mmproj) if s.mmproj and os.path.isfile(s.mmproj) else s.mmproj,  # the projector
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


@dataclass(eq=False)
class Candidate:
    """A prefix that may be written: tokens, the lowest position its state holds, the state,
    and when it was last used (time.monotonic)."""

    tokens: tuple[int, ...]
    pos_min: int
    state: bytes
    last_used: float
    lora: tuple[tuple[int, float], ...] = ()  # the adapter set the state was computed under
    tenant: str = ""  # the cache tenant whose requests computed it (recorded in the file's header)


class DiskCache:
    """One model key's files: indexed at load (headers only), read on a hit, written on
    ``persist``; the whole directory's cap is enforced after each write."""

    def __init__(self, cfg: wire.PromptCacheDisk, key: str, model_id: str) -> None:
        self.cfg = cfg
        self.root = Path(cfg.dir)
        self.key = key
        self.model_id = model_id
        self.dir = self.root / key[:32]
        self.refused = 0
        self.index: dict[str, CacheFile] = {}
        for item in cache_files.scan(self.dir):
            if isinstance(item, CacheFileError) or item.model_key != key:
                self._drop_bad(item)
            else:
                self.index[item.path.name] = item

    def _drop_bad(self, item: CacheFile | CacheFileError) -> None:
        self.refused += 1
        log.warning("prompt cache: dropping %s", item if isinstance(item, CacheFileError) else
                    f"{item.path.name} (another model key)")
        item.path.unlink(missing_ok=True)

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self.index.values())

    def entries(self) -> list[CacheFile]:
        return list(self.index.values())

    def load(self, entry: CacheFile) -> bytes | None:
        """The entry's state, checked; None (and the file dropped) when it is not intact."""
        try:
            state = cache_files.read_state(entry)
        except CacheFileError as exc:
            self.index.pop(entry.path.name, None)
            self._drop_bad(exc)
            return None
        cache_files.touch(entry.path)
        return state

    def forget(self, entry: CacheFile) -> None:
        """Drop an entry llama.cpp refused to restore."""
        self.index.pop(entry.path.name, None)
        entry.path.unlink(missing_ok=True)
        self.refused += 1

    def persist(self, candidates: list[Candidate], max_bytes: int, timeout_s: float) -> tuple[int, int]:
        """Write the most valuable candidates (most recent first, then longest) up to
        ``max_bytes`` and until ``timeout_s`` has passed; already on disk: marked used.
        Returns (files written, bytes written)."""
        deadline = time.monotonic() + timeout_s
        chosen = sorted(candidates, key=lambda c: (-c.last_used, -len(c.tokens)))
        written = n_bytes = 0
        budget = min(max_bytes, self.cfg.max_bytes)
        kept: list[Path] = []
        for c in chosen:
            if time.monotonic() >= deadline:
                log.warning("prompt cache: write stopped after %.1fs (%d files)", timeout_s, written)
                break
            name = cache_files.token_hash(c.tokens, c.lora, c.tenant) + cache_files.SUFFIX
            used_at = time.time() - max(0.0, time.monotonic() - c.last_used)  # recency: the file's mtime
            if name in self.index:
                cache_files.touch(self.index[name].path, used_at)
                kept.append(self.index[name].path)
                continue
            size = len(c.state) + 4 * len(c.tokens) + 256
            if size > budget:
                continue
            try:
                path = cache_files.write_entry(self.dir, self.key, self.model_id, c.tokens, c.pos_min, c.state,
                                               c.lora, c.tenant)
                cache_files.touch(path, used_at)
                self.index[name] = cache_files.read_header(path)
            except (OSError, CacheFileError) as exc:
                log.warning("prompt cache: cannot write %s: %s", name, exc)
                break
            budget -= size
            written += 1
            n_bytes += self.index[name].size
            kept.append(path)
        for path in cache_files.enforce_cap(self.root, self.cfg.max_bytes, keep=kept):
            self.index.pop(path.name, None)
        return written, n_bytes
