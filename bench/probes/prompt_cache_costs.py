"""What the prompt cache costs and saves on one engine, in process: a 2,000-token prefix's
prefill, its save to host RAM (the engine's thread: every other slot's stream waits that
long), its write to disk, its read and restore, and the step time of three generating
streams with and without a save in that step.

    .venv/bin/python -m bench.probes.prompt_cache_costs [--tokens 2000] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.probes.inproc import embedded_model


def measure(model: str, n_tokens: int, threads: int) -> dict[str, float]:
    import llama_cpp as ll

    from corral import wire

    from corral.state import cache_files
    from corral.worker.engine import Engine
    from corral.worker.cache.kv_store import restore_seq, save_seq

    e = Engine(wire.WorkerSettings(model_id="m", model_path=model, threads=threads, n_parallel=4,
                                   ctx_len=4 * (n_tokens + 256)))
    out: dict[str, float] = {}
    try:
        words = " ".join(f"item{i} is the {i % 7} colour of river stone," for i in range(n_tokens * 2 // 25))
        p = wire.SamplingParams(temperature=0.0, max_tokens=1)
        t0 = time.perf_counter()
        e.submit(wire.GenerateRequest(id="long", prompt=words, params=p))
        while e.has_work:
            e.step()
        out["prefill_s"] = time.perf_counter() - t0
        slot = max(e.slots, key=lambda s: len(s.cached))
        out["prefix_tokens"] = len(slot.cached)
        saves = []
        for _ in range(5):
            t0 = time.perf_counter()
            state = save_seq(e.m.ctx, slot.index)
            saves.append(time.perf_counter() - t0)
        out["state_mb"] = len(state) / 1e6
        out["save_ms"] = statistics.median(saves) * 1000
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            path = cache_files.write_entry(Path(d), "k", "m", slot.cached, 0, state)
            out["write_ms"] = (time.perf_counter() - t0) * 1000
            t0 = time.perf_counter()
            got = cache_files.read_state(cache_files.read_header(path))
            out["read_ms"] = (time.perf_counter() - t0) * 1000
        other = next(s for s in e.slots if s is not slot)
        ll.llama_memory_seq_rm(e.m.memory, other.index, -1, -1)
        t0 = time.perf_counter()
        assert restore_seq(e.m.ctx, other.index, got)
        out["restore_ms"] = (time.perf_counter() - t0) * 1000
        out["prefill_over_read_restore"] = out["prefill_s"] * 1000 / (out["read_ms"] + out["restore_ms"])
        ll.llama_memory_seq_rm(e.m.memory, other.index, -1, -1)
        # three streams generating: a step's time alone, and with a save of the long prefix in it
        gen = wire.SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        for i in range(3):
            e.submit(wire.GenerateRequest(id=f"g{i}", prompt=f"Stream {i}: once upon a time", params=gen))
        for _ in range(5):
            e.step()
        plain, with_save = [], []
        for k in range(40):
            t0 = time.perf_counter()
            if k % 2:
                save_seq(e.m.ctx, slot.index)
            e.step()
            (with_save if k % 2 else plain).append(time.perf_counter() - t0)
        out["step_ms"] = statistics.median(plain) * 1000
        out["step_with_save_ms"] = statistics.median(with_save) * 1000
        for i in range(3):
            e.abort(f"g{i}")
        e.step()
    finally:
        e.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = measure(embedded_model(), a.tokens, a.threads)
    print(json.dumps(r) if a.json else "\n".join(f"{k:28s} {v:10.2f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
