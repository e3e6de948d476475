"""GGUF key/value pairs at the byte level, for the test fixtures that start from the embedded
model: gguf's own reader builds numpy views of every one of Gemma's 262k vocabulary
strings (about 15 s a file on this machine); these read and rewrite the same bytes in
well under a second.

- ``read_kv(path, prefix)``: the key/value pairs whose key starts with ``prefix``, as
  ``(key, value, value_type, sub_type)`` that ``gguf.GGUFWriter.add_key_value`` takes back.
- ``copy_with_kv(src, dst, extra)``: ``src`` with ``extra`` keys added after its own (a key it
  has already is an error), tensor infos and data unchanged: the data section is copied
  as bytes to the next alignment after the longer header (offsets are relative to it).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["read_kv", "copy_with_kv", "UINT32"]

UINT32, _STRING, _ARRAY = 4, 8, 9
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _In:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.f.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.f.read(self.unpack("<Q")).decode("utf-8")

    def value(self, vtype: int) -> Any:
        if vtype in _FMT:
            return self.unpack(_FMT[vtype])
        if vtype == _STRING:
            return self.string()
        assert vtype == _ARRAY, vtype
        etype, count = self.unpack("<I"), self.unpack("<Q")
        if etype in _FMT:  # one read for a numeric array
            fmt = _FMT[etype]
            return list(struct.unpack(f"<{count}{fmt[1]}", self.f.read(struct.calcsize(fmt) * count)))
        return [self.value(etype) for _ in range(count)]

    def value_with_types(self, vtype: int) -> tuple[Any, int, int | None]:
        if vtype != _ARRAY:
            return self.value(vtype), vtype, None
        pos = self.f.tell()
        etype = self.unpack("<I")
        self.f.seek(pos)
        return self.value(vtype), vtype, etype


def _header(f: BinaryIO) -> tuple[int, int, int]:
    assert f.read(4) == b"GGUF", "not a GGUF file"
    version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
    return version, n_tensors, n_kv


def read_kv(path: Path, prefix: str = "") -> list[tuple[str, Any, int, int | None]]:
    out = []
    with open(path, "rb") as f:
        _, _, n_kv = _header(f)
        r = _In(f)
        for _ in range(n_kv):
            key = r.string()
            value, vtype, sub = r.value_with_types(r.unpack("<I"))
            if key.startswith(prefix):
                out.append((key, value, vtype, sub))
    return out


def _skip_value(r: _In, vtype: int) -> None:
    if vtype in _FMT:
        r.f.seek(struct.calcsize(_FMT[vtype]), 1)
    elif vtype == _STRING:
        r.f.seek(r.unpack("<Q"), 1)
    else:
        etype, count = r.unpack("<I"), r.unpack("<Q")
        if etype in _FMT:
            r.f.seek(struct.calcsize(_FMT[etype]) * count, 1)
        else:
            for _ in range(count):
                _skip_value(r, etype)


def copy_with_kv(src: Path, dst: Path, extra: dict[str, tuple[int, int | float]]) -> Path:
    """``extra``: key -> (scalar value type, value), e.g. ``{"k": (UINT32, 6)}``."""
    with open(src, "rb") as f:
        version, n_tensors, n_kv = _header(f)
        r = _In(f)
        kv_start = f.tell()
        keys, align = set(), 32
        for _ in range(n_kv):
            key = r.string()
            vtype = r.unpack("<I")
            if key == "general.alignment":
                align = r.value(vtype)
            else:
                _skip_value(r, vtype)
            keys.add(key)
        kv_end = f.tell()
        assert not keys & extra.keys(), f"{src.name} has {sorted(keys & extra.keys())} already"
        for _ in range(n_tensors):
            r.f.seek(r.unpack("<Q"), 1)
            n_dims = r.unpack("<I")
            f.seek(8 * n_dims + 4 + 8, 1)
        infos_end = f.tell()
        data_start = (infos_end + align - 1) // align * align
        f.seek(kv_start)
        old_kv = f.read(kv_end - kv_start)
        infos = f.read(infos_end - kv_end)
        new_kv = b"".join(struct.pack("<Q", len(k.encode())) + k.encode() + struct.pack("<I", t)
                          + struct.pack(_FMT[t], v) for k, (t, v) in extra.items())
        head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv + len(extra)) + old_kv + new_kv + infos
        tmp = dst.with_name(dst.name + ".part")
        with open(tmp, "wb") as out:
            out.write(head + b"\0" * (-len(head) % align))
            f.seek(data_start)
            shutil.copyfileobj(f, out, 1 << 22)
    tmp.replace(dst)
    return dst
