"""How much of a step at high concurrency is sampling, and so how far corral's sampling can
put it ahead of llama-server (issue 46's ">= 2.5x at c=32 and c=64").

corral's lead at many requests comes from sampling: llama-server draws every slot one after
another on one thread over the whole vocabulary (262,144 tokens for Gemma 3), corral on a
short candidate list in parallel (docs/internals/sampling.md). The decode itself is the same
llama.cpp on both. So llama-server's step is about ``decode + n x chain`` and corral's at
least ``decode``: the most corral can be ahead is ``(decode + n x chain) / decode``.

This probe measures both parts on the embedded model, in process, with llama-cpp-python's
low-level API (no corral code in the measured path): ``n`` sequences (8, 32, 64), each
prefilled with a short prompt, then steps of one token each:

- ``decode``: ``llama_decode`` of the step's batch of ``n`` tokens (``n_seq_max = n``, one
  KV stream a sequence, as both servers run);
- ``chain``: llama.cpp's own sampler chain as llama-server builds it for the bench's
  sampling (top_k 40, top_p 0.95, min_p 0.05, temperature 0.8, dist), ``llama_sampler_sample``
  on each of the ``n`` rows in turn on one thread: it copies the row's 262k logits into
  candidates and runs the chain, as ``common_sampler_sample`` does.

Medians over ``--steps`` steps, interleaved over ``--reps``.

    .venv/bin/python -m bench.probes.sampling_share [--threads 2] [--batches 8,32,64] [--steps 12] [--reps 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench.probes.inproc import embedded_model

PROMPT_TOKENS = 16


def _chain(ll: Any, seed: int) -> Any:
    """llama-server's chain for temperature 0.8, top_k 40, top_p 0.95, min_p 0.05 (the
    samplers a default request leaves at their no-op values are left out)."""
    p = ll.llama_sampler_chain_default_params()
    ch = ll.llama_sampler_chain_init(p)
    ll.llama_sampler_chain_add(ch, ll.llama_sampler_init_top_k(40))
    ll.llama_sampler_chain_add(ch, ll.llama_sampler_init_top_p(0.95, 1))
    ll.llama_sampler_chain_add(ch, ll.llama_sampler_init_min_p(0.05, 1))
    ll.llama_sampler_chain_add(ch, ll.llama_sampler_init_temp(0.8))
    ll.llama_sampler_chain_add(ch, ll.llama_sampler_init_dist(seed))
    return ch


def measure(model_path: str, threads: int, batches: tuple[int, ...], steps: int, reps: int,
            slot_ctx: int = 1024) -> dict[int, dict[str, float]]:
    import llama_cpp as ll

    ll.llama_backend_init()
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = ll.llama_model_load_from_file(model_path.encode(), mp)
    vocab = ll.llama_model_get_vocab(model)
    top = max(batches)
    cp = ll.llama_context_default_params()
    cp.n_ctx = top * slot_ctx
    cp.n_batch = max(512, top * PROMPT_TOKENS)
    cp.n_ubatch = 512
    cp.n_seq_max = top
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = False
    ctx = ll.llama_init_from_model(model, cp)
    mem = ll.llama_get_memory(ctx)
    batch = ll.llama_batch_init(max(cp.n_batch, top), 0, 1)
    chains = [_chain(ll, 1234 + i) for i in range(top)]
    bos = ll.llama_vocab_bos(vocab)
    out: dict[int, dict[str, list[float]]] = {b: {"decode": [], "chain": []} for b in batches}

    def put(i: int, tok: int, pos: int, seq: int, logits: bool) -> None:
        batch.token[i] = tok
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = logits

    try:
        for rep in range(reps):
            for n in batches:
                ll.llama_memory_clear(mem, True)
                k = 0  # prefill: a short prompt a sequence, its last position's logits kept
                for s in range(n):
                    for j in range(PROMPT_TOKENS):
                        put(k, bos if j == 0 else 1000 + 37 * s + j + rep, j, s, j == PROMPT_TOKENS - 1)
                        k += 1
                batch.n_tokens = k
                if ll.llama_decode(ctx, batch) != 0:
                    raise RuntimeError("prefill failed")
                rows = [(s + 1) * PROMPT_TOKENS - 1 for s in range(n)]
                dec, chn = [], []
                for step in range(steps):
                    t0 = time.perf_counter()
                    toks = [ll.llama_sampler_sample(chains[s], ctx, rows[s]) for s in range(n)]
                    t1 = time.perf_counter()
                    for s, tok in enumerate(toks):
                        put(s, tok, PROMPT_TOKENS + step, s, True)
                    batch.n_tokens = n
                    t2 = time.perf_counter()
                    if ll.llama_decode(ctx, batch) != 0:
                        raise RuntimeError("decode failed")
                    t3 = time.perf_counter()
                    rows = list(range(n))
                    chn.append((t1 - t0) * 1000)
                    dec.append((t3 - t2) * 1000)
                out[n]["decode"].append(statistics.median(dec))
                out[n]["chain"].append(statistics.median(chn))
                print(f"rep {rep} n {n}: decode {out[n]['decode'][-1]:.1f} ms, chain over {n} rows "
                      f"{out[n]['chain'][-1]:.1f} ms", file=sys.stderr, flush=True)
    finally:
        for ch in chains:
            ll.llama_sampler_free(ch)
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
        ll.llama_model_free(model)
    return {n: {k: statistics.median(v) for k, v in d.items()} for n, d in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="8,32,64")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    batches = tuple(int(x) for x in a.batches.split(","))
    r = measure(a.model or embedded_model(), a.threads, batches, a.steps, a.reps)
    print("| n | decode ms | llama.cpp chain over n rows ms | chain ms a row | chain share of decode + chain "
          "| most corral can lead: (decode + chain) / decode |")
    print("|---|---|---|---|---|---|")
    for n, d in r.items():
        dec, chn = d["decode"], d["chain"]
        print(f"| {n} | {dec:.1f} | {chn:.1f} | {chn / n:.2f} | {chn / (dec + chn):.0%} | {(dec + chn) / dec:.2f}x |")



if __name__ == "__main__":
    main()
