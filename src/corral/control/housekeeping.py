"""Housekeeping: idle models unload after their ``ttl_s``; workers report their stats.

One task wakes every second (more often for short TTLs). An idle model's unload is
re-checked at the moment it happens (``Admission.unload_idle``): a request that came
meanwhile keeps it loaded. Every ``STATS_EVERY_S`` each ready worker is asked for its
``Stats`` (memory, busy slots), which the budget and ``GET /models`` read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from corral.control.placement.admission import Admission
from corral.control.scheduling.pool import ModelPool

__all__ = ["Housekeeper", "STATS_EVERY_S"]

STATS_EVERY_S = 10.0


class Housekeeper:
    def __init__(self, pools: dict[str, ModelPool], admission: Admission,
                 background: Callable[[Coroutine[Any, Any, None], str], object]) -> None:
        self._pools = pools
        self._admission = admission
        self._background = background

    async def run(self) -> None:
        last_stats = time.monotonic()
        while True:
            await asyncio.sleep(self.tick())
            self.expire_idle(time.time())
            if time.monotonic() - last_stats >= STATS_EVERY_S:
                last_stats = time.monotonic()
                self.poll_stats()

    def tick(self) -> float:
        ttls = [t for p in self._pools.values() if (t := p.ttl_s) is not None]
        return max(0.05, min([1.0, *(t / 4 for t in ttls)]))

    def expire_idle(self, now: float) -> None:
        for pool in list(self._pools.values()):
            ttl = pool.ttl_s  # keep_alive, else the spec's ttl_s; None when pinned
            if (ttl is not None and pool.has_ready and pool.idle and not pool.draining
                    and now - pool.last_used >= ttl):
                why = "ttl_s" if pool.keep_alive_s is None else "keep_alive"
                self._background(self._admission.unload_idle(pool, f"idle for {ttl:g} s ({why})"),
                                 f"ttl {pool.spec.id}")

    def poll_stats(self) -> None:
        for pool in self._pools.values():
            for inst in pool.instances:
                self._background(self._fetch(inst.fetch_stats()), "stats")

    @staticmethod
    async def _fetch(coro: Coroutine[Any, Any, object]) -> None:
        await coro
