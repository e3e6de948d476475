"""Whether a model file reads as GGUF, and its quantization: from its header (read whole,
tensor table included, with ``corral.model.gguf_header``, the one GGUF reader), else from its
file name. No llama_cpp import: the router reads headers too.

``check_file(path)`` is what the store lists: a ``FileCheck`` with the quantization and, for a
file that does not read, the reader's reason (a model with status ``failed``). Cached per
(path, size, mtime, inode): the store lists every file on every call, and a header is read
again only when its file changed. Blocking: the router calls it off its event loop.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from corral.model.gguf_header import GGUFError, read_header

__all__ = ["FILE_TYPES", "FileCheck", "check_file", "read_file_type", "quantization_of", "quant_from_name",
           "GGUFError"]

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


@dataclass(frozen=True, slots=True)
class FileCheck:
    quantization: str | None  # the header's general.file_type, by name
    problem: str | None  # why the file does not read as GGUF; None when it does


@functools.lru_cache(maxsize=1024)
def _checked(path: str, size: int, mtime_ns: int, inode: int) -> FileCheck:
    try:
        ft = read_header(Path(path)).values.get("general.file_type")
    except FileNotFoundError:
        return FileCheck(None, None)
    except GGUFError as exc:
        return FileCheck(None, str(exc))
    return FileCheck(FILE_TYPES.get(ft) if isinstance(ft, int) else None, None)


def check_file(path: Path) -> FileCheck:
    """Whether the file at ``path`` reads as GGUF, and its quantization (blocking, cached). A
    missing file has no problem here: whoever loads it finds it missing."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return FileCheck(None, None)
    except OSError as exc:  # a symlink loop, a directory it may not enter
        why = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        return FileCheck(None, f"{Path(path).name}: cannot read: {why}")
    return _checked(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


def quantization_of(path: Path) -> str | None:
    """From the header (general.file_type), else from the file name, else None."""
    return check_file(path).quantization or quant_from_name(path.name)
