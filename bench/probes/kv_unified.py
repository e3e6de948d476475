"""One KV stream a slot (corral's default) vs one unified KV cache (llama.cpp's
``kv_unified``, llama-server's ``-kvu``) for the step of a full batch.

One engine in process per layout, the same 64 slots of ``--slot-ctx`` cells, the model's
sliding windows as corral runs them; ``batch`` slots generating (8 and 64): the median
step and its tok/s, interleaved over ``--reps``. The unified engine is the worker's own
with ``kv_unified`` set in its context's parameters (``worker/model.py`` sets it only with
speculation), so what differs is only the cache layout.

    .venv/bin/python -m bench.probes.kv_unified [--threads 2] [--reps 2] [--slot-ctx 1024]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from bench.probes.inproc import bench_params, embedded_model, open_engine, start_streams, stop_streams


def measure(model: str, threads: int, reps: int, slot_ctx: int, batches: tuple[int, ...] = (8, 64),
            steps: int = 20, gpu_layers: int = 0) -> dict[str, dict[int, float]]:
    import corral.worker.model as worker_model

    plain = worker_model.context_params
    out: dict[str, dict[int, list[float]]] = {"streams": {b: [] for b in batches}, "unified": {b: [] for b in batches}}
    for rep in range(reps):
        for layout in ("streams", "unified"):
            def params(*a: Any, **kw: Any) -> Any:
                return plain(*a, **{**kw, "kv_unified": layout == "unified"})

            worker_model.context_params = params  # type: ignore[assignment]
            e = open_engine(model, threads=threads, threads_batch=threads, n_parallel=64, ctx_len=64 * slot_ctx,
                            n_gpu_layers=gpu_layers)
            try:
                for b in batches:
                    start_streams(e, b, bench_params(steps + 8), f"{rep}-{layout}-{b}", first_prompt=rep * 100)
                    times = []
                    for _ in range(steps):
                        t0 = time.perf_counter()
                        e.step()
                        times.append(time.perf_counter() - t0)
                    out[layout][b].append(statistics.median(times) * 1000)
                    print(f"rep {rep} {layout} batch {b}: {out[layout][b][-1]:.1f} ms a step", file=sys.stderr, flush=True)
                    stop_streams(e)
            finally:
                e.close()
                worker_model.context_params = plain
    return {k: {b: statistics.median(v) for b, v in d.items()} for k, d in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--slot-ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gpu-layers", type=int, default=0)
    a = ap.parse_args()
    r = measure(a.model or embedded_model(), a.threads, a.reps, a.slot_ctx, steps=a.steps, gpu_layers=a.gpu_layers)
    print("| KV layout | batch | step ms (median) | tok/s |\n|---|---|---|---|")
    for layout, d in r.items():
        for b, ms in d.items():
            print(f"| {layout} | {b} | {ms:.1f} | {b / ms * 1000:.1f} |")


if __name__ == "__main__":
    main()
