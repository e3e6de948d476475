"""THE GGUF header reader: every key/value pair and the tensor table, no tensor data.

Neutral (imports nothing of corral), so the router, the store and the worker read a
model file the same way: ``store.gguf`` (quantization, and whether a file reads at all),
``store.gguf_meta`` (what ``corral show``, /api/show and the web page print),
``corral.fit.plan`` (memory per layer for the GPU fit plan and the router's per-device
budget).

The header is ``magic "GGUF", version u32, n_tensors u64, n_kv u64``, the key/value
pairs, then per tensor ``name, n_dims u32, dims u64[n_dims], type u32, offset u64``;
the data section starts at the next multiple of ``general.alignment``. Arrays longer
than ``SHORT_ARRAY`` (tokenizer vocabularies) are skipped and read as
``{"array_len": n}``; shorter ones (per-layer head counts) are kept as lists. A tensor's
size is the distance to the next tensor's offset (the data section is packed in offset
order), the last one's the distance to the end of the file.

The router reads headers of files anyone may drop in ``models_dir``, so the reader trusts
nothing in them: every count, length, offset, nesting depth and type is checked against
the bytes left in the file and a bound (the ``MAX_*`` below, near what llama.cpp's own
``gguf.cpp`` accepts) before anything is allocated, read or skipped; the file is read in
chunks of ``_CHUNK`` bytes, at most ``MAX_HEADER_BYTES`` of it, within ``time_limit_s``.
Whatever is wrong (not GGUF, truncated, a count past the end, a FIFO, a symlink loop, an
unreadable file) is a ``GGUFError`` whose message says what; nothing else escapes
``read_header`` but ``FileNotFoundError`` for a file that is not there.
"""

from __future__ import annotations

import errno
import os
import reprlib
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GGUFError", "GGUFHeader", "TensorInfo", "read_header", "array_len", "SHORT_ARRAY",
           "MAX_HEADER_BYTES", "READ_TIME_S"]

_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_SIZE = {t: struct.calcsize(f) for t, f in _FMT.items()}
_STRING, _ARRAY, _U32 = 8, 9, 4
_U64 = struct.Struct("<Q")
_MAX_KV = 1 << 16  # real models have 30-60 keys
_MAX_TENSORS = 1 << 16  # the largest published models have about 2,000 (experts are merged)
_MAX_STRING = 1 << 24  # 16 MiB: a chat template is a few KiB
_MAX_KEPT = 1 << 25  # 32 MiB of keys and kept values in all (long arrays are skipped, not kept)
_MAX_DEPTH = 2  # an array of arrays at most (llama.cpp accepts none)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_GGML_TYPE = 64  # ggml's type ids are below 40 today
_MAX_ALIGNMENT = 1 << 20
_CHUNK = 1 << 20
MAX_HEADER_BYTES = 1 << 28  # 256 MiB: a 262k-token vocabulary and its merges take about 10 MiB
READ_TIME_S = 10.0  # a whole header, on a slow disk; the 2,000-tensor headers take milliseconds
SHORT_ARRAY = 64  # arrays up to this length are kept (e.g. per-layer head counts)
_MIN_KV_BYTES = 8 + 4 + 1  # key length, type, the smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


class GGUFError(ValueError):
    """The file is not a readable GGUF file (the message says why)."""


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
    """The file through a window of bytes: ``take`` and ``skip`` check each length against
    what is left of the file and of ``MAX_HEADER_BYTES`` first, and read at most
    ``_CHUNK`` more than asked for."""

    def __init__(self, fd: int, size: int, deadline: float) -> None:
        self.fd, self.size, self.deadline = fd, size, deadline
        self.buf = b""
        self.pos = 0  # in buf
        self.base = 0  # the file offset of buf[0]
        self.kept = 0
        self.steps = 0

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def tick(self, every: int = 0x1000) -> None:
        self.steps += 1
        if self.steps % every == 0 and time.monotonic() > self.deadline:
            raise GGUFError(f"reading the header took longer than its time limit "
                            f"(at byte {self.offset} of {self.size})")

    def _check(self, n: int, what: str) -> None:
        if n > self.size - self.offset:
            raise GGUFError(f"truncated GGUF header: {what} needs {n} bytes at offset {self.offset}, "
                            f"the file has {self.size - self.offset} left")
        if self.offset + n > MAX_HEADER_BYTES:
            raise GGUFError(f"the GGUF header is longer than {MAX_HEADER_BYTES >> 20} MiB")

    def _window(self, n: int, what: str) -> None:
        """At least ``n`` bytes in the window from ``pos`` (checked against the file first)."""
        self._check(n, what)
        if self.pos + n > len(self.buf):
            rest = self.buf[self.pos:]
            want = min(max(n - len(rest), _CHUNK), self.size - self.base - len(self.buf))
            chunks = [rest]
            got = 0
            while got < want:
                b = os.pread(self.fd, want - got, self.base + len(self.buf) + got)
                if not b:
                    break
                chunks.append(b)
                got += len(b)
            self.base += self.pos
            self.buf, self.pos = b"".join(chunks), 0
            if len(self.buf) < n:
                raise GGUFError("truncated GGUF header (the file shrank while it was read)")

    def take(self, n: int, what: str) -> bytes:
        self._window(n, what)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def skip_strings(self, count: int, what: str) -> None:
        """``count`` strings skipped (a vocabulary: the hot loop of a real header)."""
        unpack = _U64.unpack_from
        for i in range(count):
            if self.pos + 8 > len(self.buf):
                self._window(8, what)
            (n,) = unpack(self.buf, self.pos)
            self.pos += 8
            if n > _MAX_STRING:
                raise GGUFError(f"{what} claims a string of {n} bytes (at most {_MAX_STRING})")
            if self.pos + n <= len(self.buf):
                self.pos += n
            else:
                self.skip(n, what)
            if i & 0xFFF == 0xFFF:
                self.tick(every=1)

    def skip(self, n: int, what: str) -> None:
        self._check(n, what)
        if self.pos + n <= len(self.buf):
            self.pos += n
        else:
            self.base, self.buf, self.pos = self.offset + n, b"", 0

    def scalar(self, vtype: int) -> Any:
        return struct.unpack(_FMT[vtype], self.take(_SIZE[vtype], "a value"))[0]

    def u32(self) -> int:
        return int(self.scalar(4))

    def u64(self) -> int:
        return int(self.scalar(10))

    def string(self, what: str, keep: bool = True) -> str:
        n = self.u64()
        if n > _MAX_STRING:
            raise GGUFError(f"{what} claims {n} bytes (at most {_MAX_STRING})")
        if not keep:
            self.skip(n, what)
            return ""
        self.kept += n
        if self.kept > _MAX_KEPT:
            raise GGUFError(f"the header's keys and values take more than {_MAX_KEPT >> 20} MiB")
        return self.take(n, what).decode("utf-8", "replace")

    def value(self, vtype: int, key: str, keep: bool = True, depth: int = 0) -> Any:
        self.tick()
        if vtype in _FMT:
            if not keep:
                self.skip(_SIZE[vtype], f"the value of {key}")
                return None
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string(f"the string of {key}", keep)
        if vtype != _ARRAY:
            raise GGUFError(f"{key} has unknown GGUF value type {vtype}")
        if depth >= _MAX_DEPTH:
            raise GGUFError(f"{key} nests arrays deeper than {_MAX_DEPTH}")
        etype, count = self.u32(), self.u64()
        least = _SIZE.get(etype, 8 if etype == _STRING else 12 if etype == _ARRAY else 0)
        if least == 0:
            raise GGUFError(f"{key} is an array of unknown GGUF value type {etype}")
        if count > (self.size - self.offset) // least:
            raise GGUFError(f"{key} claims {count} elements, more than the {self.size - self.offset} "
                            f"bytes left in the file hold")
        if keep and count <= SHORT_ARRAY:
            return [self.value(etype, key, True, depth + 1) for _ in range(count)]
        if etype in _FMT:
            self.skip(least * count, f"the {count} elements of {key}")
        elif etype == _STRING:
            self.skip_strings(count, f"the strings of {key}")
        else:
            for _ in range(count):
                self.value(etype, key, False, depth + 1)
        return {"array_len": count}


def _named(text: str) -> str:
    """A key or tensor name as an error quotes it: at most 80 characters (a name may be 16 MiB)."""
    return repr(text if len(text) <= 80 else text[:80] + "...")


def _open(p: Path) -> tuple[int, int]:
    """A descriptor of the regular file at ``p`` and its size. Opened non-blocking, so a FIFO
    named ``*.gguf`` cannot hold the reader; GGUFError for anything but a regular file."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        why = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise GGUFError(f"{p.name}: cannot open: {why}") from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise GGUFError(f"{p.name}: cannot read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise GGUFError(f"{p.name} is not a regular file")
    return fd, st.st_size


def read_header(path: str | Path, *, tensors: bool = True, time_limit_s: float = READ_TIME_S) -> GGUFHeader:
    """The header of the GGUF file at ``path`` (``tensors=False``: the key/value pairs only).
    Raises ``GGUFError`` saying what is wrong, or ``FileNotFoundError``."""
    p = Path(path)
    fd, size = _open(p)
    try:
        return _parse(_Reader(fd, size, time.monotonic() + time_limit_s), p, tensors)
    except OSError as exc:  # an I/O error part way
        raise GGUFError(f"{p.name}: cannot read: {exc.strerror or exc}") from None
    except (struct.error, OverflowError, MemoryError, RecursionError) as exc:  # the checks above leave none: a last guard
        raise GGUFError(f"{p.name}: unreadable GGUF header ({type(exc).__name__})") from None
    finally:
        os.close(fd)


def _parse(r: _Reader, p: Path, tensors: bool) -> GGUFHeader:
    if r.size == 0:
        raise GGUFError(f"{p.name} is empty (0 bytes)")
    if r.size < 4 or r.take(4, "the magic") != b"GGUF":
        raise GGUFError(f"{p.name} is not a GGUF file")
    version = r.u32()
    if version not in (2, 3):
        raise GGUFError(f"GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = r.u64(), r.u64()
    if n_kv > _MAX_KV or n_kv > (r.size - r.offset) // _MIN_KV_BYTES:
        raise GGUFError(f"implausible GGUF key count {n_kv} for a file of {r.size} bytes")
    if n_tensors > _MAX_TENSORS:
        raise GGUFError(f"implausible GGUF tensor count {n_tensors} (at most {_MAX_TENSORS})")
    values: dict[str, Any] = {}
    align = 32
    for _ in range(n_kv):
        key = r.string("a key")
        if key in values:
            raise GGUFError(f"key {_named(key)} appears twice")
        vtype = r.u32()
        values[key] = r.value(vtype, f"key {_named(key)}")
        if key == "general.alignment":
            align = values[key]
            if vtype != _U32 or not 0 < align <= _MAX_ALIGNMENT or align & (align - 1):
                raise GGUFError(f"general.alignment must be a power of two as u32, not {reprlib.repr(align)} "
                                f"(type {vtype})")
    if n_tensors > (r.size - r.offset) // _MIN_TENSOR_BYTES:
        raise GGUFError(f"implausible GGUF tensor count {n_tensors} for a file of {r.size} bytes")
    infos: list[TensorInfo] = []
    if tensors:
        names: set[str] = set()
        for _ in range(n_tensors):
            r.tick()
            name = r.string("a tensor name")
            label = f"tensor {_named(name)}"
            if name in names:
                raise GGUFError(f"{label} appears twice")
            names.add(name)
            n_dims = r.u32()
            if n_dims > _MAX_DIMS:
                raise GGUFError(f"{label} has {n_dims} dimensions (at most {_MAX_DIMS})")
            shape = tuple(r.u64() for _ in range(n_dims))
            count = 1
            for d in shape:
                count *= d
            if count >= 1 << 63:
                raise GGUFError(f"{label} has {count} elements (a shape of {shape})")
            ggml_type = r.u32()
            if ggml_type >= _MAX_GGML_TYPE:
                raise GGUFError(f"{label} has unknown ggml type {ggml_type}")
            infos.append(TensorInfo(name, shape, r.u64()))
    data_start = (r.offset + align - 1) // align * align
    if tensors:
        data_bytes = r.size - data_start
        for t in infos:
            if t.offset % align:
                raise GGUFError(f"tensor {_named(t.name)}'s offset {t.offset} is not a multiple of {align}")
            if t.offset > data_bytes or (t.offset == data_bytes and 0 not in t.shape):
                raise GGUFError(f"tensor {_named(t.name)}'s data at offset {t.offset} starts past the end "
                                f"of the file ({max(0, data_bytes)} bytes of data)")
    return GGUFHeader(values, tuple(infos), data_start if tensors else 0, r.size)
