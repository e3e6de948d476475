"""What the cores allow for two busy models, with no router: workers driven directly.

The multimodel scenario asks two model processes (4 slots, c=4 each) to match one model
process (8 slots, c=8). Two processes cannot share one batch, so each runs its own decode
on part of the cores. This measures, in one run and with the same client as the direct
path of the overhead scenario (bench/clients/wire_driver.py):

- one worker, ``threads`` threads, 8 slots, c=8 (the reference);
- two workers, 4 slots each, c=4 each at once, each pinned to its own share of the cores
  with one thread per core it has (the best static split: no oversubscription);
- two workers, 4 slots each, ``threads`` threads each, not pinned, governor on (what
  corral does when nobody tells it anything).

Rounds are interleaved so drifting background load hits every row alike.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from corral import wire

from bench.clients.loadgen import LoadResult, combined
from bench.clients.wire_driver import DirectWorker


def _pin(w: DirectWorker, cpus: set[int]) -> None:
    """Pin the worker process and every thread it has (ggml's threads start later and
    inherit the process's mask, the ones already running are set one by one)."""
    assert w.proc is not None
    for tid in os.listdir(f"/proc/{w.proc.pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


async def measure(model: str, threads: int, slot_ctx: int, n_one: int, n_each: int, rounds: int,
                  log: Any) -> dict[str, list[LoadResult]]:
    n_cpus = len(os.sched_getaffinity(0))
    halves = [set(range(0, n_cpus // 2)) or {0}, set(range(n_cpus // 2, n_cpus)) or {0}]

    def settings(n_parallel: int, t: int) -> wire.WorkerSettings:
        return wire.WorkerSettings(model_id="limit", model_path=model, n_parallel=n_parallel,
                                   ctx_len=n_parallel * slot_ctx, threads=t, threads_batch=t)

    one = DirectWorker(settings(8, threads), name="limit-one")
    pinned = [DirectWorker(settings(4, max(1, len(h))), name=f"limit-pinned-{k}") for k, h in enumerate(halves)]
    free = [DirectWorker(settings(4, threads), name=f"limit-free-{k}") for k in range(2)]
    out: dict[str, list[LoadResult]] = {"one": [], "pinned": [], "free": []}
    everyone = [one, *pinned, *free]
    try:
        for w in everyone:
            await w.start()
        for w, h in zip(pinned, halves):
            _pin(w, h)
        for w in everyone:
            await w.run_load(label="warmup", concurrency=2, n_requests=2, max_tokens=8, first_index=900_000)
        for rnd in range(rounds):
            log(f"multimodel limit round {rnd + 1}/{rounds}")
            out["one"].append(await one.run_load(label="one", concurrency=8, n_requests=n_one,
                                                 first_index=rnd * 1000))
            for name, pair in (("pinned", pinned), ("free", free)):
                parts = await asyncio.gather(*(w.run_load(label=f"{name}-{k}", concurrency=4, n_requests=n_each,
                                                          first_index=rnd * 1000 + 100 * k)
                                               for k, w in enumerate(pair)))
                out[name].append(combined(name, list(parts)))
    finally:
        for w in everyone:
            await w.stop()
    return out
