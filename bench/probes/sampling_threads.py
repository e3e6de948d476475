"""Sampling a step's slots on several threads (``sampling_threads``): two measurements.

    # per-step draw time, in-process, pools of 1/2/4 threads swapped step by step (interleaved);
    # a variant "1full" is 1 thread drawing over the whole vocabulary (no short list)
    python -m bench.probes.sampling_threads step --slots 8,32 --variants 1,2,4,1full [--threads 2] [--gpu-layers N]
    # tok/s of worker processes reached over their sockets, one per variant, rounds interleaved
    python -m bench.probes.sampling_threads ab --concurrency 8 --variants 1,2 --rounds 6 [--threads 2] [--gpu-layers N]

``step``: one engine with ``max(slots)`` slots; for each slot count, that many streams
(64+ tokens, ignore_eos, the bench's sampling: temperature 0.8, top_k 40, top_p 0.95,
min_p 0.05) are prefilled, then every step runs with the next variant's pool in turn. It
prints, per variant, the median time of the step's draws (``SamplePool.map``: the part
that runs on the threads), of the rest of the slots' work on the engine thread
(``_take``: detokenize, stop strings, Deltas) and of the whole step.

``ab``: one worker process per variant (``sampling_threads`` = the variant, "auto"
allowed), all loaded at once; in each round every variant runs ``--requests`` requests
at ``--concurrency`` (64 tokens each) in turn; prints each round's tok/s and the ratio to
the first variant, then the medians. Run it un-niced: a niced run measures the scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from corral import wire


def model_path(arg: str | None) -> str:
    if arg:
        return arg
    from corral.store.embedded import embedded_model_path

    return str(embedded_model_path())


# --------------------------------------------------------------------------- step


def cmd_step(a: argparse.Namespace) -> None:
    from corral.worker.sampling.pool import SamplePool
    from bench.probes.inproc import bench_params, open_engine, start_streams, stop_streams

    slots = [int(x) for x in a.slots.split(",")]
    variants = [x.strip() for x in a.variants.split(",")]
    n_slots = max(slots)
    e = open_engine(model_path(a.model), threads=a.threads, n_parallel=n_slots, ctx_len=n_slots * 512,
                    n_gpu_layers=a.gpu_layers, sampling_threads=1)
    pools = {v: SamplePool(int(v.removesuffix("full"))) for v in variants}
    timing: dict[str, float] = {"map": 0.0, "take": 0.0}

    def timed(pool: SamplePool) -> Any:
        inner = pool.map

        def map_(fn: Any, items: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(fn, items)
            finally:
                timing["map"] += time.perf_counter() - t0
        setattr(pool, "map", map_)
        return pool

    for p in pools.values():
        timed(p)
    take = e._take

    def take_(slot: Any, drawn: Any) -> None:
        t0 = time.perf_counter()
        take(slot, drawn)
        timing["take"] += time.perf_counter() - t0
    setattr(e, "_take", take_)
    params = bench_params(400, seed=1)
    print(f"model {Path(model_path(a.model)).name}, n_vocab {e.m.n_vocab}, decode threads {a.threads}, "
          f"gpu layers {e.info.gpu_layers}, cpus {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.2f}")
    print("| slots | sampling threads | draws ms/step (median) | per slot ms | rest of sampling ms | step ms |")
    print("|---|---|---|---|---|---|")
    for c in slots:
        start_streams(e, c, params, f"s{c}")
        shorts = {s.index: s.sampler.short for s in e.slots if s.sampler is not None}

        def use(v: str) -> None:
            e.pool = pools[v]
            for s in e.slots:  # "full": the whole vocabulary (worker/sampling/candidates.py off)
                if s.sampler is not None:
                    s.sampler.short = None if v.endswith("full") else shorts.get(s.index)

        for _ in range(3):  # warm the pool threads
            for v in variants:
                use(v)
                e.step()
        rows: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
        for _ in range(a.steps):
            for v in variants:
                use(v)
                timing["map"] = timing["take"] = 0.0
                t0 = time.perf_counter()
                e.step()
                rows[v].append((timing["map"], timing["take"], time.perf_counter() - t0))
        for v in variants:
            m = statistics.median(r[0] for r in rows[v]) * 1000
            t = statistics.median(r[1] for r in rows[v]) * 1000
            s = statistics.median(r[2] for r in rows[v]) * 1000
            print(f"| {c} | {v} | {m:.2f} | {m / c:.3f} | {t:.2f} | {s:.1f} |")
        stop_streams(e)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    use(variants[0])
    for p in pools.values():
        p.close()
    e.close()


# --------------------------------------------------------------------------- ab


async def cmd_ab(a: argparse.Namespace) -> None:
    from bench.clients.wire_driver import DirectWorker

    variants = a.variants.split(",")
    c = a.concurrency
    workers: dict[str, DirectWorker] = {}
    try:
        for v in variants:
            s = wire.WorkerSettings(model_id="bench", model_path=model_path(a.model), threads=a.threads,
                                    n_parallel=c, ctx_len=c * 1024, n_gpu_layers=a.gpu_layers,
                                    sampling_threads="auto" if v == "auto" else int(v))
            w = DirectWorker(s, name=f"sampling-threads-{v}")
            await w.start()
            await w.run_load(label="warmup", concurrency=c, n_requests=c, max_tokens=8, first_index=900_000)
            workers[str(v)] = w
        names = list(workers)
        print(f"c={c}, {a.requests} requests x 64 tokens per round, decode threads {a.threads}, "
              f"gpu layers {a.gpu_layers}, cpus {len(os.sched_getaffinity(0))}, load {os.getloadavg()[0]:.2f}")
        print("| round | " + " | ".join(f"sampling_threads={n} tok/s" for n in names) + " | ratio |")
        print("|---" * (len(names) + 2) + "|")
        per: dict[str, list[float]] = {n: [] for n in names}
        for rnd in range(a.rounds):
            order = names if rnd % 2 == 0 else names[::-1]  # neither always goes first
            for n in order:
                r = await workers[n].run_load(label=n, concurrency=c, n_requests=a.requests,
                                              first_index=rnd * 1000)
                if r.errors:
                    raise SystemExit(f"{n}: {r.errors} errors: {r.error_samples[:1]}")
                per[n].append(r.tok_s)
            ratios = " / ".join(f"{per[n][-1] / per[names[0]][-1]:.2f}x" for n in names[1:])
            print(f"| {rnd + 1} | " + " | ".join(f"{per[n][-1]:.1f}" for n in names) + f" | {ratios} |")
        med = {n: statistics.median(v) for n, v in per.items()}
        ratios = " / ".join(f"{med[n] / med[names[0]]:.2f}x" for n in names[1:])
        print("| median | " + " | ".join(f"{med[n]:.1f}" for n in names) + f" | {ratios} |")
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        for w in workers.values():
            await w.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("step", "ab"):
        p = sub.add_parser(name)
        p.add_argument("--model", default=None, help="GGUF file (default: the embedded Gemma 3 270M)")
        p.add_argument("--threads", type=int, default=2, help="decode threads")
        p.add_argument("--gpu-layers", type=int, default=0)
    st = sub.choices["step"]
    st.add_argument("--slots", default="8,32")
    st.add_argument("--variants", default="1,2,4")
    st.add_argument("--steps", type=int, default=20, help="measured steps per variant and slot count")
    ab = sub.choices["ab"]
    ab.add_argument("--concurrency", type=int, default=8)
    ab.add_argument("--variants", default="1,2")
    ab.add_argument("--rounds", type=int, default=6)
    ab.add_argument("--requests", type=int, default=16, help="requests per variant and round")
    a = ap.parse_args()
    if a.cmd == "step":
        cmd_step(a)
    else:
        asyncio.run(cmd_ab(a))


if __name__ == "__main__":
    main()
