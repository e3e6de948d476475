"""What a GGUF file holds, by layer: the input the GPU fit plan needs before a load.

Reads the header's key/value pairs (only the numbers it needs, seeking past the rest,
tokenizer arrays included) and the tensor table; a tensor's size is the distance to the
next tensor's offset (the data section is packed in offset order), the last one's the
distance to the end of the file. No llama_cpp import and no tensor data read.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["ModelLayout", "read_layout", "LayoutError"]

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LAYER = re.compile(r"^blk\.(\d+)\.")
_MAX_COUNT = 1 << 24


class LayoutError(ValueError):
    pass


@dataclass(frozen=True)
class ModelLayout:
    architecture: str
    n_layer: int
    n_embd: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer (blk.N.*)
    output_bytes: int  # the output head and final norm (offloaded with n_gpu_layers = n_layer + 1)
    input_bytes: int  # token embeddings and the rest (llama.cpp keeps the input layer on the host)
    sliding_window: int = 0  # 0: every layer attends over the whole context
    swa_pattern: int = 0  # every swa_pattern-th layer is a full-attention layer

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes

    def kv_bytes_per_cell(self) -> int:
        """K and V of one cell in one layer, f16."""
        return 2 * self.n_head_kv * (self.head_dim_k + self.head_dim_v)


def _read(f: BinaryIO, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise LayoutError("truncated GGUF header")
    return b


def _u32(f: BinaryIO) -> int:
    return int(struct.unpack("<I", _read(f, 4))[0])


def _u64(f: BinaryIO) -> int:
    return int(struct.unpack("<Q", _read(f, 8))[0])


def _string(f: BinaryIO) -> str:
    n = _u64(f)
    if n > _MAX_COUNT:
        raise LayoutError("string too long in GGUF header")
    return _read(f, n).decode("utf-8", "replace")


def _value(f: BinaryIO, vtype: int, keep: bool) -> object:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, n = _u32(f), _u64(f)
        if n > _MAX_COUNT * 16:
            raise LayoutError("array too long in GGUF header")
        if etype in _SCALARS and not keep:
            f.seek(n * struct.calcsize(_SCALARS[etype]), 1)
            return n
        if etype == _STRING and not keep:
            for _ in range(n):
                f.seek(_u64(f), 1)
            return n
        return [_value(f, etype, keep) for _ in range(n)]
    raise LayoutError(f"unknown GGUF value type {vtype}")


def read_layout(path: str | Path) -> ModelLayout:
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as f:
        if _read(f, 4) != b"GGUF":
            raise LayoutError(f"not a GGUF file: {p}")
        version = _u32(f)
        if version < 2:
            raise LayoutError(f"unsupported GGUF version {version}")
        n_tensors, n_kv = _u64(f), _u64(f)
        if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
            raise LayoutError("implausible GGUF counts")
        meta: dict[str, object] = {}
        for _ in range(n_kv):
            key = _string(f)
            vtype = _u32(f)
            # arrays are only counted (the vocabulary's length is all we need of them)
            meta[key] = _value(f, vtype, keep=False)
        tensors: list[tuple[int, str]] = []
        for _ in range(n_tensors):
            name = _string(f)
            n_dims = _u32(f)
            if n_dims > 8:
                raise LayoutError(f"tensor {name} has {n_dims} dimensions")
            f.seek(8 * n_dims + 4, 1)  # dims, type
            tensors.append((_u64(f), name))
        align_v = meta.get("general.alignment", 32)
        align = align_v if isinstance(align_v, int) and align_v > 0 else 32
        data_start = (f.tell() + align - 1) // align * align
    tensors.sort()
    sizes: dict[str, int] = {}
    for i, (off, name) in enumerate(tensors):
        end = tensors[i + 1][0] if i + 1 < len(tensors) else size - data_start
        sizes[name] = max(0, end - off)

    arch = str(meta.get("general.architecture", ""))

    def num(key: str, default: int = 0) -> int:
        v = meta.get(f"{arch}.{key}", default)
        if isinstance(v, list):  # per-layer arrays: take the largest
            v = max((x for x in v if isinstance(x, int)), default=default)
        return int(v) if isinstance(v, (int, float)) else default

    n_layer = num("block_count")
    if n_layer <= 0:
        raise LayoutError(f"no {arch}.block_count in {p}")
    n_embd = num("embedding_length")
    n_head = num("attention.head_count", 1)
    n_head_kv = num("attention.head_count_kv", n_head)
    head_k = num("attention.key_length", n_embd // max(1, n_head))
    head_v = num("attention.value_length", head_k)
    layers = [0] * n_layer
    output = inputs = 0
    for name, nbytes in sizes.items():
        m = _LAYER.match(name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += nbytes
        elif name.startswith("output"):
            output += nbytes
        else:
            inputs += nbytes
    vocab = meta.get("tokenizer.ggml.tokens", 0)
    n_vocab = vocab if isinstance(vocab, int) else num("vocab_size")
    pattern = num("attention.sliding_window_pattern", 6 if arch.startswith("gemma3") else 0)
    return ModelLayout(architecture=arch, n_layer=n_layer, n_embd=n_embd, n_head_kv=n_head_kv,
                       head_dim_k=head_k, head_dim_v=head_v, n_vocab=n_vocab,
                       layer_bytes=tuple(layers), output_bytes=output, input_bytes=inputs,
                       sliding_window=num("attention.sliding_window"), swa_pattern=pattern)
