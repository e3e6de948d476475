"""A GGUF file's metadata and parameter count, from its header (no llama_cpp import).

``read_metadata(path)`` returns every key/value pair (scalars and strings as they are;
arrays as their length unless ``arrays=True`` and short) and the parameter count summed
over the tensor shapes. Cached per (path, size, mtime): /api/tags and /api/show read it
for every model. ``describe(meta)`` gives what Ollama's ``details`` shows (family,
parameter size such as "268M").
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from corral.store.gguf import FILE_TYPES, GGUFError

__all__ = ["GGUFMetadata", "read_metadata", "parameter_size"]

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KV = 1 << 20
_MAX_TENSORS = 1 << 22
_SHORT_ARRAY = 64  # arrays up to this length are kept (e.g. per-layer head counts)


@dataclass(frozen=True, slots=True)
class GGUFMetadata:
    values: dict[str, Any]  # key -> value; long arrays -> {"array_len": n}
    n_params: int | None

    @property
    def architecture(self) -> str | None:
        arch = self.values.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def chat_template(self) -> str | None:
        t = self.values.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None

    @property
    def quantization(self) -> str | None:
        ft = self.values.get("general.file_type")
        return FILE_TYPES.get(ft) if isinstance(ft, int) else None

    def context_length(self) -> int | None:
        v = self.values.get(f"{self.architecture}.context_length")
        return v if isinstance(v, int) else None


class _Reader:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise GGUFError("truncated GGUF header")
        return b

    def scalar(self, vtype: int) -> Any:
        fmt = _FMT[vtype]
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.read(self.scalar(10)).decode("utf-8", "replace")

    def value(self, vtype: int, keep_arrays: bool) -> Any:
        if vtype in _FMT:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, count = self.scalar(4), self.scalar(10)
            if etype in _FMT and (not keep_arrays or count > _SHORT_ARRAY):
                self.f.seek(struct.calcsize(_FMT[etype]) * count, 1)
                return {"array_len": count}
            if keep_arrays and count <= _SHORT_ARRAY:
                return [self.value(etype, keep_arrays) for _ in range(count)]
            for _ in range(count):
                if etype == _STRING:
                    self.f.seek(self.scalar(10), 1)
                else:
                    self.value(etype, False)
            return {"array_len": count}
        raise GGUFError(f"unknown GGUF value type {vtype}")


def _read(path: Path) -> GGUFMetadata:
    with open(path, "rb") as f:
        r = _Reader(f)
        if r.read(4) != b"GGUF":
            raise GGUFError(f"{path.name} is not a GGUF file")
        version = r.scalar(4)
        if version < 2:
            raise GGUFError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = r.scalar(10), r.scalar(10)
        if n_kv > _MAX_KV or n_tensors > _MAX_TENSORS:
            raise GGUFError("implausible GGUF header counts")
        values: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            values[key] = r.value(r.scalar(4), True)
        n_params = 0
        for _ in range(n_tensors):
            r.string()  # tensor name
            n_dims = r.scalar(4)
            if n_dims > 8:
                raise GGUFError("implausible tensor rank")
            count = 1
            for _ in range(n_dims):
                count *= r.scalar(10)
            r.read(12)  # type u32, offset u64
            n_params += count
    return GGUFMetadata(values, n_params or None)


@functools.lru_cache(maxsize=256)
def _cached(path: str, size: int, mtime_ns: int) -> GGUFMetadata | None:
    try:
        return _read(Path(path))
    except (OSError, GGUFError, struct.error, KeyError):
        return None


def read_metadata(path: Path) -> GGUFMetadata | None:
    """The header's metadata, or None when the file is missing or not readable GGUF."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return _cached(str(path), st.st_size, st.st_mtime_ns)


def parameter_size(n_params: int | None) -> str:
    """268098176 -> "268.10M", as Ollama writes parameter sizes ("7.6B", "268.10M")."""
    if not n_params:
        return ""
    if n_params >= 1_000_000_000:
        return f"{n_params / 1e9:.1f}B"
    if n_params >= 1_000_000:
        return f"{n_params / 1e6:.2f}M"
    return f"{n_params / 1e3:.2f}K"
