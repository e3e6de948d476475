"""A GGUF file's metadata and parameter count, from its header (``corral.model.gguf_header``).

``read_metadata(path)`` returns every key/value pair (scalars and strings as they are;
short arrays as lists, long ones as ``{"array_len": n}``) and the parameter count summed
over the tensor shapes. Cached per (path, size, mtime): /api/tags and /api/show read it
for every model. ``parameter_size`` gives what Ollama's ``details`` shows ("268.10M");
``read_gguf_info`` what ``corral show`` and the web page print.
"""

from __future__ import annotations

import errno
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.model.gguf_header import GGUFError, read_header
from corral.store.gguf import FILE_TYPES, quant_from_name

__all__ = ["GGUFMetadata", "read_metadata", "parameter_size", "read_gguf_info"]


@dataclass(frozen=True, slots=True)
class GGUFMetadata:
    values: dict[str, Any]  # key -> value; long arrays -> {"array_len": n}
    n_params: int | None

    @property
    def architecture(self) -> str | None:
        arch = self.values.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def has_fim(self) -> bool:
        """The vocabulary names prefix, suffix and middle FIM tokens (infill works)."""
        return all(f"tokenizer.ggml.fim_{k}_token_id" in self.values for k in ("pre", "suf", "mid"))

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


@functools.lru_cache(maxsize=256)
def _cached(path: str, size: int, mtime_ns: int) -> GGUFMetadata | GGUFError:
    """The file's metadata, or the reader's error (kept too: a bad file is not read again
    until it changes)."""
    try:
        header = read_header(Path(path))
    except FileNotFoundError:
        return GGUFError(f"{Path(path).name} is gone")
    except GGUFError as exc:
        return GGUFError(str(exc))  # without its traceback (the frames of the read)
    return GGUFMetadata(header.values, header.n_params or None)


def _metadata(path: Path) -> tuple[GGUFMetadata | GGUFError, int]:
    """Through the cache, with the file's size. FileNotFoundError (or another OSError) from
    the stat."""
    st = Path(path).stat()
    return _cached(str(path), st.st_size, st.st_mtime_ns), st.st_size


def read_metadata(path: Path) -> GGUFMetadata | None:
    """The header's metadata, or None when the file is missing or not readable GGUF
    (blocking, cached per (path, size, mtime))."""
    try:
        meta, _ = _metadata(path)
    except OSError:
        return None
    return meta if isinstance(meta, GGUFMetadata) else None


def parameter_size(n_params: int | None) -> str:
    """268098176 -> "268.10M", as Ollama writes parameter sizes ("7.6B", "268.10M")."""
    if not n_params:
        return ""
    if n_params >= 1_000_000_000:
        return f"{n_params / 1e9:.1f}B"
    if n_params >= 1_000_000:
        return f"{n_params / 1e6:.2f}M"
    return f"{n_params / 1e3:.2f}K"


def _human_params(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)


def read_gguf_info(path: Path) -> dict[str, Any]:
    """architecture, name, parameters, quantization, context length, chat template, size
    (what ``corral show`` prints; blocking, cached with ``read_metadata``). Raises ``GGUFError``
    (saying why) or ``FileNotFoundError``."""
    try:
        meta, size = _metadata(path)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink loop, a directory it may not enter
        why = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise GGUFError(f"{path.name}: cannot read: {why}") from None
    if isinstance(meta, GGUFError):
        raise GGUFError(str(meta))  # a new one: the cached one's traceback would grow with each raise
    values = meta.values
    arch = meta.architecture
    params = values.get("general.parameter_count", meta.n_params or 0)
    return {
        "architecture": arch,
        "name": values.get("general.name"),
        "parameters": params,
        "parameters_human": _human_params(params) if isinstance(params, int) else None,
        "size_label": values.get("general.size_label"),
        "quantization": meta.quantization or quant_from_name(path.name),
        "context_length": values.get(f"{arch}.context_length") if arch else None,
        "embedding_length": values.get(f"{arch}.embedding_length") if arch else None,
        "block_count": values.get(f"{arch}.block_count") if arch else None,
        "chat_template": meta.chat_template,
        "file_bytes": size,
    }
