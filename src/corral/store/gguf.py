"""Just enough of the GGUF format to read a model's quantization from its header.

The header is ``magic "GGUF", version u32, n_tensors u64, n_kv u64`` followed by the
key/value pairs. We walk the pairs (seeking past values we don't need, including the
large tokenizer arrays) until ``general.file_type`` turns up. No llama_cpp import: the
router reads headers too.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import BinaryIO

__all__ = ["FILE_TYPES", "read_file_type", "quantization_of", "quant_from_name", "GGUFError"]

# llama_ftype (llama.h) -> the name people use in file names.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE",
}

# GGUF value types: fixed sizes of the scalar ones.
_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_MAX_KV = 1 << 20

_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|TQ\d_\d|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)


class GGUFError(ValueError):
    """The file is not a readable GGUF file."""


def _read(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise GGUFError("truncated GGUF header")
    return b


def _u32(f: BinaryIO) -> int:
    return int.from_bytes(_read(f, 4), "little")


def _u64(f: BinaryIO) -> int:
    return int.from_bytes(_read(f, 8), "little")


def _skip_value(f: BinaryIO, vtype: int) -> None:
    if vtype in _SCALAR_SIZE:
        f.seek(_SCALAR_SIZE[vtype], 1)
    elif vtype == _STRING:
        f.seek(_u64(f), 1)
    elif vtype == _ARRAY:
        etype, count = _u32(f), _u64(f)
        if etype in _SCALAR_SIZE:
            f.seek(_SCALAR_SIZE[etype] * count, 1)
        else:
            for _ in range(count):
                _skip_value(f, etype)
    else:
        raise GGUFError(f"unknown GGUF value type {vtype}")


def read_file_type(path: Path) -> int | None:
    """``general.file_type`` from the header, or None when the key is absent."""
    with open(path, "rb") as f:
        if _read(f, 4) != b"GGUF":
            raise GGUFError(f"{path.name} is not a GGUF file")
        version = _u32(f)
        if version < 2:
            raise GGUFError(f"GGUF version {version} is not supported")
        _u64(f)  # tensor count
        n_kv = _u64(f)
        if n_kv > _MAX_KV:
            raise GGUFError("implausible GGUF key count")
        for _ in range(n_kv):
            key = _read(f, _u64(f)).decode("utf-8", "replace")
            vtype = _u32(f)
            if key == "general.file_type" and vtype == _UINT32:
                return _u32(f)
            _skip_value(f, vtype)
    return None


def quant_from_name(name: str) -> str | None:
    """The quantization tag in a file name (``...-Q4_K_M.gguf`` -> ``Q4_K_M``)."""
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    found = _QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


@functools.lru_cache(maxsize=512)
def _cached(path: str, size: int, mtime_ns: int) -> str | None:
    try:
        ft = read_file_type(Path(path))
    except (OSError, GGUFError):
        return None
    return FILE_TYPES.get(ft) if ft is not None else None


def quantization_of(path: Path) -> str | None:
    """From the header (general.file_type), else from the file name, else None."""
    try:
        st = path.stat()
    except OSError:
        return quant_from_name(path.name)
    return _cached(str(path), st.st_size, st.st_mtime_ns) or quant_from_name(path.name)
