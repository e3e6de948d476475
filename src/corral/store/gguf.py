"""A model's quantization: from its GGUF header (``general.file_type``, read with
``corral.model.gguf_header``, the one GGUF reader), else from its file name. No llama_cpp
import: the router reads headers too.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from corral.model.gguf_header import GGUFError, read_header

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

_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|TQ\d_\d|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)


def read_file_type(path: Path) -> int | None:
    """``general.file_type`` from the header, or None when the key is absent."""
    ft = read_header(path, tensors=False).values.get("general.file_type")
    return ft if isinstance(ft, int) else None


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
