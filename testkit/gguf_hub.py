"""GGUF files for the fake Hub's search and fit tests (tests/store/fake_hub.py), written by hand:
a llama-shaped tensor table whose sizes are chosen (the fit estimate reads only the
header), zeros for the data. Not loadable by llama.cpp (the pull-and-load test uses the
embedded model); what they are for is the header.

- ``write_llama_shaped``: ``n_layer`` layers of ``layer_bytes`` each, an output head and token
  embeddings; ``vocab`` token strings in the header (a larger header); ``split=(k, n)``:
  part ``k`` of ``n`` of a split model (part 1 has the metadata and the token embeddings,
  the layers are dealt out over the parts, the head is in the last).
- ``lying_header``: a GGUF whose first string claims to be 2**40 bytes long.
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["write_llama_shaped", "lying_header"]

_U32, _STRING, _ARRAY, _U64 = 4, 8, 9, 10
_F32 = 0  # ggml type of the tensors (their sizes are what matter)


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _kv_u32(key: str, v: int) -> bytes:
    return _s(key) + struct.pack("<II", _U32, v)


def _kv_str(key: str, v: str) -> bytes:
    return _s(key) + struct.pack("<I", _STRING) + _s(v)


def write_llama_shaped(dst: Path, *, n_layer: int = 8, layer_bytes: int = 256 * 1024, n_embd: int = 256,
                       n_head: int = 8, n_head_kv: int = 2, ctx_train: int = 8192, vocab: int = 2000,
                       head_bytes: int = 512 * 1024, split: tuple[int, int] = (1, 1)) -> Path:
    k, n = split
    kv: list[bytes] = []
    if k == 1:
        kv += [_kv_str("general.architecture", "llama"), _kv_str("general.name", dst.stem),
               _kv_u32("llama.block_count", n_layer), _kv_u32("llama.context_length", ctx_train),
               _kv_u32("llama.embedding_length", n_embd), _kv_u32("llama.attention.head_count", n_head),
               _kv_u32("llama.attention.head_count_kv", n_head_kv)]
        tokens = b"".join(_s(f"tok{i}") for i in range(vocab))
        kv.append(_s("tokenizer.ggml.tokens") + struct.pack("<IIQ", _ARRAY, _STRING, vocab) + tokens)
    if n > 1:
        kv += [_s("split.no") + struct.pack("<IH", 2, k - 1), _s("split.count") + struct.pack("<IH", 2, n)]
    tensors: list[tuple[str, int]] = []
    if k == 1:
        tensors.append(("token_embd.weight", head_bytes))
    for layer in range(n_layer):
        if layer * n // n_layer == k - 1:
            tensors += [(f"blk.{layer}.attn_q.weight", layer_bytes // 2),
                        (f"blk.{layer}.ffn_up.weight", layer_bytes - layer_bytes // 2)]
    if k == n:
        tensors += [("output_norm.weight", 4 * n_embd), ("output.weight", head_bytes)]
    infos, offset = [], 0
    for name, nbytes in tensors:
        elems = nbytes // 4
        infos.append(_s(name) + struct.pack("<I", 1) + struct.pack("<Q", elems) + struct.pack("<IQ", _F32, offset))
        offset += -(-nbytes // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    head += b"\0" * (-len(head) % 32)
    with open(dst, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset)  # the data: zeros
    return dst


def lying_header(dst: Path, *, size: int = 4 * 1024 * 1024) -> Path:
    """A GGUF whose first key claims 2**40 bytes, then ``size`` bytes of filler."""
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40)
    with open(dst, "wb") as f:
        f.write(head)
        f.truncate(size)
    return dst
