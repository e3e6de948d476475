"""THE GGUF header reader: every key/value pair and the tensor table, no tensor data.

Neutral (imports nothing of corral), so the router, the store and the worker read a
model file the same way: ``store.gguf`` (quantization), ``store.gguf_meta`` (what
``corral show``, /api/show and the web page print), ``corral.fit.plan`` (memory per
layer for the GPU fit plan and the router's per-device budget).

The header is ``magic "GGUF", version u32, n_tensors u64, n_kv u64``, the key/value
pairs, then per tensor ``name, n_dims u32, dims u64[n_dims], type u32, offset u64``;
the data section starts at the next multiple of ``general.alignment``. Arrays longer
than ``SHORT_ARRAY`` (tokenizer vocabularies) are skipped with seeks and read as
``{"array_len": n}``; shorter ones (per-layer head counts) are kept as lists. A tensor's
size is the distance to the next tensor's offset (the data section is packed in offset
order), the last one's the distance to the end of the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["GGUFError", "GGUFHeader", "TensorInfo", "read_header", "array_len", "SHORT_ARRAY"]

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KV = 1 << 20
_MAX_TENSORS = 1 << 22
_MAX_STRING = 1 << 24  # 16 MiB: a chat template is a few KiB
SHORT_ARRAY = 64  # arrays up to this length are kept (e.g. per-layer head counts)


class GGUFError(ValueError):
    """The file is not a readable GGUF file."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    offset: int  # from the start of the data section


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    values: dict[str, Any]  # key -> value; long arrays -> {"array_len": n}
    tensors: tuple[TensorInfo, ...]  # empty when read with tensors=False
    data_start: int
    file_bytes: int

    @property
    def n_params(self) -> int:
        total = 0
        for t in self.tensors:
            count = 1
            for d in t.shape:
                count *= d
            total += count
        return total

    def tensor_bytes(self) -> dict[str, int]:
        """Each tensor's size in the file."""
        order = sorted(self.tensors, key=lambda t: t.offset)
        end_of_data = self.file_bytes - self.data_start
        out: dict[str, int] = {}
        for i, t in enumerate(order):
            end = order[i + 1].offset if i + 1 < len(order) else end_of_data
            out[t.name] = max(0, end - t.offset)
        return out


def array_len(value: Any) -> int | None:
    """The length of an array value as read here (a kept list or a skipped one)."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, dict) and isinstance(value.get("array_len"), int):
        return int(value["array_len"])
    return None


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

    def u32(self) -> int:
        return int(self.scalar(4))

    def u64(self) -> int:
        return int(self.scalar(10))

    def string(self) -> str:
        n = self.u64()
        if n > _MAX_STRING:
            raise GGUFError("implausible GGUF string length")
        return self.read(n).decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool = True) -> Any:
        if vtype in _FMT:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise GGUFError(f"unknown GGUF value type {vtype}")
        etype, count = self.u32(), self.u64()
        if keep and count <= SHORT_ARRAY:
            return [self.value(etype, False) for _ in range(count)]
        if etype in _FMT:
            self.f.seek(struct.calcsize(_FMT[etype]) * count, 1)
        elif etype == _STRING:
            for _ in range(count):
                self.f.seek(self.u64(), 1)
        else:
            for _ in range(count):
                self.value(etype, False)
        return {"array_len": count}


def read_header(path: str | Path, *, tensors: bool = True) -> GGUFHeader:
    """The header of the GGUF file at ``path`` (``tensors=False``: the key/value pairs only).
    Raises ``GGUFError`` (not GGUF, truncated, implausible counts) or ``OSError``."""
    p = Path(path)
    with open(p, "rb") as f:
        r = _Reader(f)
        if r.read(4) != b"GGUF":
            raise GGUFError(f"{p.name} is not a GGUF file")
        version = r.u32()
        if version < 2:
            raise GGUFError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = r.u64(), r.u64()
        if n_kv > _MAX_KV or n_tensors > _MAX_TENSORS:
            raise GGUFError("implausible GGUF key or tensor count")
        values: dict[str, Any] = {}
        for _ in range(n_kv):
            key = r.string()
            values[key] = r.value(r.u32())
        infos: list[TensorInfo] = []
        if tensors:
            for _ in range(n_tensors):
                name = r.string()
                n_dims = r.u32()
                if n_dims > 8:
                    raise GGUFError(f"tensor {name} has {n_dims} dimensions")
                shape = tuple(r.u64() for _ in range(n_dims))
                r.u32()  # type
                infos.append(TensorInfo(name, shape, r.u64()))
        align_v = values.get("general.alignment", 32)
        align = align_v if isinstance(align_v, int) and align_v > 0 else 32
        data_start = (f.tell() + align - 1) // align * align
        size = p.stat().st_size
    return GGUFHeader(values, tuple(infos), data_start if tensors else 0, size)
