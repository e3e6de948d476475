"""The ceiling for two busy models, from the cost of one decode step.

Two models with 4 slots each cannot share a batch: each process decodes its own 4
sequences. Whatever the router does, their aggregate tok/s over one model with 8 slots
is bounded by how a step's cost scales with its batch and threads. One engine, in
process, nothing else running, measures the median step (all slots generating) for:

- a batch of 8 on ``threads`` threads (the one-model reference);
- a batch of 4 on ``threads // 2`` threads: two such processes side by side, each on
  its half of the cores, without even sharing memory bandwidth, reach at most
  ``step(8, threads) / step(4, threads // 2)`` of the reference;
- a batch of 4 on ``threads`` threads: two processes taking turns on all the cores
  reach at most ``step(8, threads) / (2 * step(4, threads))``.

    .venv/bin/python -m bench.probes.batch_cost [--threads 2] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.probes.inproc import embedded_model


def measure(model: str, threads: int, reps: int, steps: int = 40) -> dict[str, float]:
    from bench.probes.inproc import bench_params, open_engine, start_streams, stop_streams

    e = open_engine(model, threads=threads, threads_batch=threads, n_parallel=8, ctx_len=8 * 512)
    half = max(1, threads // 2)
    cases = {"b8": (8, threads), "b4_half": (4, half), "b4_all": (4, threads)}
    params = bench_params(steps + 8)
    found: dict[str, list[float]] = {k: [] for k in cases}
    try:
        for rep in range(reps):  # interleaved, so drift hits every case alike
            for name, (batch, t) in cases.items():
                e.set_threads(t)
                start_streams(e, batch, params, f"{rep}-{name}", first_prompt=rep * 10)
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    e.step()
                    times.append(time.perf_counter() - t0)
                found[name].append(statistics.median(times) * 1000)
                stop_streams(e)
    finally:
        e.close()
    ms = {k: statistics.median(v) for k, v in found.items()}
    return {**{f"{k}_ms": v for k, v in ms.items()}, "threads": threads, "half": half,
            "split_ceiling": ms["b8"] / ms["b4_half"], "turns_ceiling": ms["b8"] / (2 * ms["b4_all"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object (for python -m bench.run)")
    a = ap.parse_args()
    r = measure(a.model or embedded_model(), a.threads, a.reps)
    if a.json:
        print(json.dumps(r))
        return
    print(f"step ms, batch 8 on {r['threads']} threads: {r['b8_ms']:.1f}; batch 4 on {r['half']}: "
          f"{r['b4_half_ms']:.1f}; batch 4 on {r['threads']}: {r['b4_all_ms']:.1f}")
    print(f"ceiling for two models side by side: {r['split_ceiling']:.2f}x; taking turns: {r['turns_ceiling']:.2f}x")


if __name__ == "__main__":
    main()
