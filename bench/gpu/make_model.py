"""Write a GGUF model with random weights in a known shape (default: TinyLlama 1.1B).

The GPU machine reaches no hub and the embedded Gemma (253 MB) need not travel: a
model's speed does not depend on its weights' values, only on its shape and types.
Uses llama.cpp's own GGUF writer (gguf-py, from the sources bench/gpu/prepare.sh
stripped: bench/gpu/run.sh puts .gpu/gguf-py first on PYTHONPATH; elsewhere the PyPI
``gguf`` package), F16 weights, a SentencePiece-style vocabulary of made-up pieces.

    python3 -m bench.gpu.make_model OUT.gguf [--layers 22 --embd 2048 --ff 5632 --heads 32 --kv-heads 4]

A draft pair (bench/gpu/run.sh, scenario speculation-draft): each tensor's values depend only on
its name and the seed, so a model written with fewer ``--layers`` is the first layers of one
with more (the same embeddings, layers and head); ``--layer-scale`` (< 1) shrinks what each
layer adds to the residual stream (attn_output, ffn_down), so a 2-layer draft predicts much
like its 22-layer target: a pair with a real acceptance rate, as a distilled draft has.
"""

from __future__ import annotations

import argparse
import zlib
from pathlib import Path

import gguf
import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layer-scale", type=float, default=1.0)
    a = ap.parse_args()
    head_dim = a.embd // a.heads
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random-llama-{a.layers}x{a.embd}")
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    # vocabulary: <unk> <s> </s>, the 256 byte pieces, then made-up pieces
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581w{i}" for i in range(a.vocab - len(tokens))]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (a.vocab - 259))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(a.vocab)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def rand(name: str, *shape: int, scale: float = 1.0) -> np.ndarray:
        rng = np.random.default_rng([a.seed, zlib.crc32(name.encode())])  # a tensor's values: its name's
        return (rng.standard_normal(shape, dtype=np.float32) * (0.02 * scale)).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    kv = a.kv_heads * head_dim
    w.add_tensor("token_embd.weight", rand("token_embd.weight", a.vocab, a.embd))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones(a.embd))
        w.add_tensor(p + "attn_q.weight", rand(p + "attn_q.weight", a.embd, a.embd))
        w.add_tensor(p + "attn_k.weight", rand(p + "attn_k.weight", kv, a.embd))
        w.add_tensor(p + "attn_v.weight", rand(p + "attn_v.weight", kv, a.embd))
        w.add_tensor(p + "attn_output.weight", rand(p + "attn_output.weight", a.embd, a.embd, scale=a.layer_scale))
        w.add_tensor(p + "ffn_norm.weight", ones(a.embd))
        w.add_tensor(p + "ffn_gate.weight", rand(p + "ffn_gate.weight", a.ff, a.embd))
        w.add_tensor(p + "ffn_up.weight", rand(p + "ffn_up.weight", a.ff, a.embd))
        w.add_tensor(p + "ffn_down.weight", rand(p + "ffn_down.weight", a.embd, a.ff, scale=a.layer_scale))
    w.add_tensor("output_norm.weight", ones(a.embd))
    w.add_tensor("output.weight", rand("output.weight", a.vocab, a.embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out} ({Path(a.out).stat().st_size / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
