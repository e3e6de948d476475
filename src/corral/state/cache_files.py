"""The prompt cache's files: one saved prefix per file, written atomically, checked on read.
The worker writes and reads them (``corral.worker.cache.disk``); ``corral cache ls | clear``
and the router's metrics list them. Imports nothing of corral.

    <state_dir>/prompt-cache/<model key>/<token hash>.kv

    MAGIC (8) | header length (u32 LE) | header (JSON) | tokens (int32 LE each) | KV state | sha256 (32)

The header names the model key (the model file's identity and every load setting that
changes the KV: ``corral.worker.cache.disk.model_key``), the model id (for people), the
token count, the state's size, the lowest position the state holds (sliding-window
layers keep only the last window), the LoRA adapter set the KV was computed under
(``lora``: [[adapter index, scale], ...], [] for none) and the cache tenant whose requests
computed it (``tenant``, a digest; "" on a server without keys); both are part of the file's name. The
sha256 covers everything before it: a truncated or bit-flipped file is refused
(``CacheFileError``) and the caller drops it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUFFIX", "CacheFile", "CacheFileError", "token_hash", "write_entry", "read_header",
           "read_state", "scan", "enforce_cap", "clear", "touch", "total_bytes"]

SUFFIX = ".kv"
MAGIC = b"CORRALPC"
VERSION = 1
_HEADER_MAX = 1 << 16
_TMP_PREFIX = ".tmp-"
_STALE_TMP_S = 600.0  # a temp file this old is a write that died (another writer may be mid-write)


class CacheFileError(ValueError):
    """A file that is not a whole, intact prompt-cache entry."""

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        super().__init__(f"{path.name}: {message}")


@dataclass(frozen=True)
class CacheFile:
    path: Path
    model_key: str
    model_id: str
    tokens: tuple[int, ...]
    pos_min: int  # the lowest position the state holds (sliding-window layers)
    state_bytes: int
    size: int  # the file's bytes
    mtime: float  # last written or used: eviction goes by it
    lora: tuple[tuple[int, float], ...] = ()  # the adapter set the KV was computed under (() : none)
    tenant: str = ""  # whose requests computed it (wire.GenerateRequest.cache_tenant); restored only for them

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def token_hash(tokens: Sequence[int], lora: Sequence[tuple[int, float]] = (), tenant: str = "") -> str:
    """The file name (without suffix) of the entry holding ``tokens`` computed under the
    LoRA adapter set ``lora`` ((adapter index, scale) pairs) for the cache tenant ``tenant``
    (none of either: the tokens alone)."""
    h = hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens))
    if lora:
        h.update(json.dumps([[int(i), float(v)] for i, v in lora]).encode())
    if tenant:
        h.update(b"\0tenant:" + tenant.encode())
    return h.hexdigest()[:40]


def write_entry(directory: Path, model_key: str, model_id: str, tokens: Sequence[int], pos_min: int,
                state: bytes, lora: Sequence[tuple[int, float]] = (), tenant: str = "") -> Path:
    """Write one entry atomically (temp file, fsync, rename, fsync of the directory). The
    entry holds a prompt: the file is 0600 and the directories made for it 0700."""
    _private_dirs(directory)
    header = json.dumps({"v": VERSION, "key": model_key, "model": model_id, "n_tokens": len(tokens),
                         "pos_min": pos_min, "state_bytes": len(state), "created": time.time(),
                         "lora": [[int(i), float(v)] for i, v in lora], "tenant": tenant}).encode()
    digest = hashlib.sha256()
    parts = [MAGIC, struct.pack("<I", len(header)), header, struct.pack(f"<{len(tokens)}i", *tokens), state]
    final = directory / (token_hash(tokens, lora, tenant) + SUFFIX)
    tmp = directory / f"{_TMP_PREFIX}{os.getpid()}-{final.name}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)  # a temp file left by an older corral keeps its mode through O_TRUNC
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                digest.update(p)
                f.write(p)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(directory)
    return final


def _private_dirs(directory: Path) -> None:
    """``directory`` and each missing parent made 0700 (``mkdir(parents=True)`` gives the
    parents the umask's mode)."""
    missing = []
    d = directory
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another writer made it meanwhile
            d.mkdir(mode=0o700)
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory.name} is not a directory")


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _count(path: Path, meta: dict[str, object], field: str, most: int) -> int:
    """``meta[field]`` as an integer in 0..most (a crafted header's 1e400 or -1 is refused)."""
    v = meta[field]
    if type(v) is not int or not 0 <= v <= most:
        raise CacheFileError(path, f"{field} {str(v)[:40]!r} is not an integer in 0..{most}")
    return v


def read_header(path: Path) -> CacheFile:
    """The entry's header and tokens (not its state); ``CacheFileError`` when the file is
    not one, its header is out of bounds (sizes beyond the file, a nesting the header's
    shape does not have) or its length is not what its header says (a truncated write)."""
    try:
        st = path.stat()
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + 4)
            if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
                raise CacheFileError(path, "not a prompt-cache file")
            (n_header,) = struct.unpack("<I", head[len(MAGIC):])
            if n_header > _HEADER_MAX:
                raise CacheFileError(path, f"header of {n_header} bytes")
            meta = json.loads(f.read(n_header))  # at most 64 KiB: a deep nesting is a RecursionError
            if not isinstance(meta, dict):
                raise CacheFileError(path, "the header is not an object")
            n_tok = _count(path, meta, "n_tokens", st.st_size // 4)  # bounded by the file before reading
            n_state = _count(path, meta, "state_bytes", st.st_size)
            pos_min = _count(path, meta, "pos_min", n_tok)
            raw = f.read(4 * n_tok)
        if meta.get("v") != VERSION or len(raw) != 4 * n_tok:
            raise CacheFileError(path, f"version {str(meta.get('v'))[:20]} or truncated tokens")
        want = len(MAGIC) + 4 + n_header + 4 * n_tok + n_state + 32
        if st.st_size != want:
            raise CacheFileError(path, f"{st.st_size} bytes, its header says {want} (truncated?)")
        tokens = struct.unpack(f"<{n_tok}i", raw)
        lora = meta.get("lora", [])
        if not isinstance(lora, list) or len(lora) > 64:
            raise CacheFileError(path, "lora is not a list of at most 64 adapters")
        return CacheFile(path, str(meta["key"])[:256], str(meta.get("model", ""))[:256], tokens, pos_min, n_state,
                         st.st_size, st.st_mtime, tuple((int(i), float(v)) for i, v in lora),
                         str(meta.get("tenant", ""))[:128])
    except CacheFileError:
        raise
    except (OSError, ValueError, KeyError, TypeError, struct.error, OverflowError, RecursionError) as exc:
        raise CacheFileError(path, f"unreadable ({type(exc).__name__})") from None


def read_state(entry: CacheFile) -> bytes:
    """The entry's KV state, after checking the file's sha256 (``CacheFileError`` if it
    changed, was truncated or does not match its header any more)."""
    try:
        data = entry.path.read_bytes()
    except OSError as exc:
        raise CacheFileError(entry.path, str(exc)) from exc
    if len(data) != entry.size or len(data) < 32:
        raise CacheFileError(entry.path, f"{len(data)} bytes, expected {entry.size}")
    body, digest = data[:-32], data[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise CacheFileError(entry.path, "checksum mismatch")
    return body[len(body) - entry.state_bytes:]


def scan(directory: Path) -> Iterator[CacheFile | CacheFileError]:
    """Every entry file under ``directory`` (one model key's, or the whole cache), and an
    error for each file that is not a whole entry. Removes temp files of writes that died."""
    if not directory.is_dir():
        return
    now = time.time()
    for path in sorted(directory.rglob("*")):
        if path.name.startswith(_TMP_PREFIX):
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > _STALE_TMP_S:
                    path.unlink()
            continue
        if path.suffix != SUFFIX or not path.is_file():
            continue
        try:
            yield read_header(path)
        except CacheFileError as exc:
            yield exc


def _files(root: Path) -> list[tuple[float, int, Path]]:
    out = []
    if root.is_dir():
        for path in root.rglob("*" + SUFFIX):
            with contextlib.suppress(OSError):
                st = path.stat()
                out.append((st.st_mtime, st.st_size, path))
    return out


def total_bytes(root: Path) -> tuple[int, int]:
    """(files, bytes) of the whole cache under ``root``."""
    files = _files(root)
    return len(files), sum(size for _, size, _ in files)


def enforce_cap(root: Path, max_bytes: int, keep: Iterable[Path] = ()) -> list[Path]:
    """Delete the least recently used entries under ``root`` (all models) until the rest fit
    ``max_bytes``; the ``keep`` files go last. Returns the deleted paths."""
    kept = set(keep)
    files = sorted(_files(root), key=lambda f: (f[2] in kept, f[0]))
    total = sum(size for _, size, _ in files)
    removed = []
    for _, size, path in files:
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
        total -= size
    return removed


def clear(root: Path, model_id: str | None = None) -> tuple[int, int]:
    """Delete every entry (or ``model_id``'s); (files, bytes) deleted. Unreadable files go too."""
    n = size = 0
    for item in list(scan(root)):
        if isinstance(item, CacheFileError):
            continue
        if model_id is None or item.model_id == model_id:
            with contextlib.suppress(OSError):
                item.path.unlink()
                n, size = n + 1, size + item.size
    if model_id is None:
        for _, s, path in _files(root):  # what scan could not read
            with contextlib.suppress(OSError):
                path.unlink()
                n, size = n + 1, size + s
    return n, size


def touch(path: Path, when: float | None = None) -> None:
    """Mark an entry as used now (or at ``when``, a time.time()): its mtime is its recency."""
    with contextlib.suppress(OSError):
        os.utime(path, None if when is None else (when, when))
