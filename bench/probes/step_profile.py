"""Where corral's step spends its host time with many slots generating (issue 46: "profile
corral at c=64 on 2 cores and take what the profile shows").

One engine in process as a worker sets it up (``bench.probes.inproc``), ``--slots``
streams (the bench's sampling, ``ignore_eos``) prefilled, then ``--steps`` steps under
``cProfile`` on the engine thread. The step is cut into what the profile attributes to:

- ``llama_decode``: the batch's decode in llama.cpp (cProfile does not see a ctypes call
  as a function of its own: this is the own time of the functions that call it, worker/
  batch.py's and preempt/'s ``decode``);
- ``sampling``: ``SamplePool.map`` (the draws, on the pool's threads, as the engine thread
  waits for them);
- ``per-slot work``: ``Engine._take`` (detokenize, stop strings, the Deltas);
- ``the rest``: the step's own bookkeeping (the batch built, features, outputs).

Then the functions with the most own time (``--top``).

    .venv/bin/python -m bench.probes.step_profile [--slots 64] [--steps 20] [--threads 2] [--top 12]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Any

from bench.probes.inproc import bench_params, embedded_model, open_engine, start_streams, stop_streams


def _seconds(stats: pstats.Stats, names: tuple[str, ...], files: tuple[str, ...], own: bool = False) -> float:
    """The seconds (cumulative, or ``own``) of the functions named ``names`` whose file ends
    in one of ``files``."""
    total = 0.0
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (file, _line, fn), (_cc, _nc, tt, ct, _callers) in raw.items():
        if fn in names and any(file.endswith(f) for f in files):
            total += tt if own else ct
    return total


def measure(model: str, slots: int, steps: int, threads: int, top: int) -> tuple[dict[str, float], str]:
    e = open_engine(model, threads=threads, threads_batch=threads, n_parallel=slots, ctx_len=slots * 1024)
    try:
        start_streams(e, slots, bench_params(steps + 8), "profile")
        prof = cProfile.Profile()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            prof.enable()
            e.step()
            prof.disable()
            times.append(time.perf_counter() - t0)
        stop_streams(e)
    finally:
        e.close()
    stats = pstats.Stats(prof)
    whole = sum(times)
    decode = _seconds(stats, ("decode",), ("worker/batch.py", "preempt/urgent.py", "preempt/preemption.py"),
                      own=True)
    sampling = _seconds(stats, ("map",), ("sampling/pool.py",))
    take = _seconds(stats, ("_take",), ("worker/engine.py",))
    parts = {"step (median ms)": statistics.median(times) * 1000, "llama_decode": decode / whole,
             "sampling": sampling / whole, "per-slot work": take / whole,
             "the rest": max(0.0, 1 - (decode + sampling + take) / whole)}
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return parts, out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    parts, table = measure(a.model or embedded_model(), a.slots, a.steps, a.threads, a.top)
    print(f"| {a.slots} slots generating | share of the step |\n|---|---|")
    for k, v in parts.items():
        print(f"| {k} | {v:.1f} |" if k.startswith("step") else f"| {k} | {v:.1%} |")
    print("\n```\n" + "\n".join(line for line in table.splitlines() if line.strip()) + "\n```")


if __name__ == "__main__":
    main()
