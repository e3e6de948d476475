"""A model's memory by layer, read from its GGUF file: ``ModelLayout`` (the weights of each
repeating layer, the output head, the input layer, the attention shape that sizes the KV
cache, the sliding window) and ``read_layout`` (the GGUF tensor table and metadata).
``kv_row_bytes``: a cache type's bytes for a row of elements. What ``corral.fit.plan``
plans with, on both sides (neutral: imports only ``wire``, ``settings``, ``gguf_header``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from pathlib import Path

from corral import wire
from corral.model.gguf_header import GGUFError, array_len, read_header
from corral.model.settings import KV_CACHE_TYPES

__all__ = ["ModelLayout", "read_layout", "kv_row_bytes", "GGUFError", "MAX_LAYERS"]

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS

_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class ModelLayout:
    architecture: str
    n_layer: int
    n_embd: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer (blk.N.*)
    output_bytes: int  # the output head and final norm (offloaded from n_gpu_layers = 1 on)
    input_bytes: int  # token embeddings and the rest (llama.cpp keeps the input layer on the host)
    sliding_window: int = 0  # 0: every layer attends over the whole context
    swa_pattern: int = 0  # every swa_pattern-th layer is a full-attention layer
    # no output.weight (tied embeddings, e.g. Gemma): llama.cpp puts a copy of the token
    # embeddings on the output's device as the head
    tied_output_bytes: int = 0
    n_ctx_train: int = 0  # {arch}.context_length (0: not given); the worker caps each slot at it

    @property
    def head_bytes(self) -> int:
        """What the output unit takes on its device."""
        return self.output_bytes + self.tied_output_bytes

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes

    def on_devices(self, gpus: Sequence[wire.DeviceInfo]) -> ModelLayout:
        """As llama.cpp places it on these GPUs: a head larger than the last one's largest matrix
        (``DeviceInfo.max_tensor_bytes``, from its ``supports_op``) stays on the host, a tied head in
        the host's mapping of the token embeddings (no bytes of its own), an output.weight counted there."""
        limit = gpus[-1].max_tensor_bytes if gpus else 0
        if limit <= 0 or (self.tied_output_bytes or self.output_bytes) <= limit:
            return self
        if self.tied_output_bytes:
            return dataclasses.replace(self, tied_output_bytes=0)
        return dataclasses.replace(self, output_bytes=0, input_bytes=self.input_bytes + self.output_bytes)

    def kv_sized(self, swa_full: bool) -> ModelLayout:
        """The layout as its KV cache is sized: with ``swa_full`` no layer keeps only a window."""
        return dataclasses.replace(self, sliding_window=0) if swa_full else self

    def trained_ctx(self, ctx_len: int, n_slots: int) -> int:
        """``ctx_len`` with each slot capped at ``n_ctx_train``, as the worker caps it."""
        return min(ctx_len, self.n_ctx_train * max(1, n_slots)) if self.n_ctx_train > 0 else ctx_len

    def kv_bytes_per_cell(self, type_k: str = "f16", type_v: str = "f16") -> int:
        """K and V of one cell in one layer, for these cache types (``KV_CACHE_TYPES``)."""
        return self.n_head_kv * (kv_row_bytes(self.head_dim_k, type_k) + kv_row_bytes(self.head_dim_v, type_v))


def kv_row_bytes(n: int, cache_type: str) -> int:
    """Bytes of ``n`` elements of a cache type (rounded up to whole blocks, as ggml stores them)."""
    per_block, block = KV_CACHE_TYPES[cache_type]
    return -(-n // block) * per_block


def read_layout(path: str | Path) -> ModelLayout:
    """The layout of a GGUF file (``GGUFError`` when it has no ``ARCH.block_count``)."""
    header = read_header(path)
    meta = header.values
    arch = str(meta.get("general.architecture", ""))

    def num(key: str, default: int = 0) -> int:
        v = meta.get(f"{arch}.{key}", default)
        if isinstance(v, list):  # per-layer arrays: take the largest
            v = max((x for x in v if isinstance(x, int)), default=default)
        if isinstance(v, float) and not math.isfinite(v):
            return default  # int(inf) would be an OverflowError, int(nan) a ValueError
        return int(v) if isinstance(v, (int, float)) else default

    n_layer = num("block_count")
    if n_layer <= 0:
        raise GGUFError(f"no {arch}.block_count in {path}")
    if n_layer > MAX_LAYERS:  # a list of this length is made below: the count is the file's word only
        raise GGUFError(f"{arch}.block_count {n_layer} is more than llama.cpp's {MAX_LAYERS} layers")
    n_embd = num("embedding_length")
    n_head = num("attention.head_count", 1)
    n_head_kv = num("attention.head_count_kv", n_head)
    head_k = num("attention.key_length", n_embd // max(1, n_head))
    head_v = num("attention.value_length", head_k)
    if num("attention.key_length_mla") > 0:  # MLA (DeepSeek 2 and kin): llama.cpp keeps no V cache
        head_v = 0
    layers = [0] * n_layer
    output = inputs = 0
    tensors = header.tensor_bytes()
    for name, nbytes in tensors.items():
        m = _LAYER.match(name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += nbytes
        elif name.startswith("output"):
            output += nbytes
        else:
            inputs += nbytes
    n_vocab = array_len(meta.get("tokenizer.ggml.tokens")) or num("vocab_size")
    pattern = num("attention.sliding_window_pattern", 6 if arch.startswith("gemma3") else 0)
    return ModelLayout(architecture=arch, n_layer=n_layer, n_embd=n_embd, n_head_kv=n_head_kv,
                       head_dim_k=head_k, head_dim_v=head_v, n_vocab=n_vocab,
                       layer_bytes=tuple(layers), output_bytes=output, input_bytes=inputs,
                       sliding_window=num("attention.sliding_window"), swa_pattern=pattern,
                       tied_output_bytes=0 if "output.weight" in tensors else tensors.get("token_embd.weight", 0),
                       n_ctx_train=num("context_length"))
