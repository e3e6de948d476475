"""What `corral show` prints about a model file: a GGUF header's useful metadata.

Reads the key/value pairs (strings and scalars; arrays are skipped, so the large
tokenizer vocabularies cost a seek) and, when ``general.parameter_count`` is absent,
counts the parameters from the tensor infos that follow. No llama_cpp import.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from corral.store.gguf import FILE_TYPES, GGUFError, _read, _u32, _u64, quant_from_name

__all__ = ["read_gguf_info", "read_metadata"]

_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KV = 1 << 20
_MAX_TENSORS = 1 << 22
_MAX_STRING = 1 << 24  # 16 MiB: a chat template is a few KiB


def _string(f: BinaryIO) -> str:
    n = _u64(f)
    if n > _MAX_STRING:
        raise GGUFError("implausible GGUF string length")
    return _read(f, n).decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int) -> Any:
    """A scalar or string value; arrays are skipped and read as their length."""
    fmt = _SCALAR_FMT.get(vtype)
    if fmt is not None:
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, _read(f, size))[0]
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, count = _u32(f), _u64(f)
        efmt = _SCALAR_FMT.get(etype)
        if efmt is not None:
            f.seek(struct.calcsize(efmt) * count, 1)
        elif etype == _STRING:
            for _ in range(count):
                f.seek(_u64(f), 1)
        else:
            for _ in range(count):
                _value(f, etype)
        return {"array_length": count}
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_metadata(path: Path, *, count_parameters: bool = True) -> tuple[dict[str, Any], int | None]:
    """Every key/value of the header (arrays as ``{"array_length": n}``) and the number
    of parameters counted from the tensor infos (None when not asked for)."""
    with open(path, "rb") as f:
        if _read(f, 4) != b"GGUF":
            raise GGUFError(f"{path.name} is not a GGUF file")
        version = _u32(f)
        if version < 2:
            raise GGUFError(f"GGUF version {version} is not supported")
        n_tensors, n_kv = _u64(f), _u64(f)
        if n_kv > _MAX_KV or n_tensors > _MAX_TENSORS:
            raise GGUFError("implausible GGUF key or tensor count")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(f)
            meta[key] = _value(f, _u32(f))
        if not count_parameters:
            return meta, None
        params = 0
        for _ in range(n_tensors):
            _string(f)  # name
            n_dims = _u32(f)
            if n_dims > 8:
                raise GGUFError("implausible tensor rank")
            count = 1
            for _ in range(n_dims):
                count *= _u64(f)
            _u32(f)  # type
            _u64(f)  # offset
            params += count
        return meta, params


def _human_params(n: int) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)


def read_gguf_info(path: Path) -> dict[str, Any]:
    """architecture, name, parameters, quantization, context length, chat template, size."""
    meta, counted = read_metadata(path)
    arch = meta.get("general.architecture")
    params = meta.get("general.parameter_count", counted)
    ftype = meta.get("general.file_type")
    quant = FILE_TYPES.get(ftype) if isinstance(ftype, int) else None
    template = meta.get("tokenizer.chat_template")
    return {
        "architecture": arch,
        "name": meta.get("general.name"),
        "parameters": params,
        "parameters_human": _human_params(params) if isinstance(params, int) else None,
        "size_label": meta.get("general.size_label"),
        "quantization": quant or quant_from_name(path.name),
        "context_length": meta.get(f"{arch}.context_length") if arch else None,
        "embedding_length": meta.get(f"{arch}.embedding_length") if arch else None,
        "block_count": meta.get(f"{arch}.block_count") if arch else None,
        "chat_template": template if isinstance(template, str) else None,
        "file_bytes": path.stat().st_size,
    }

