"""Admission: the one place that starts workers, within the budget.

Budget: ``max_loaded_models`` and ``memory_budget`` (the bytes workers report in
Ready/Stats: weights + KV cache; for a model never loaded, its file size). A load
beyond the budget evicts the least recently used idle model; a model with requests
running or queued, a model that is loading, and a pinned model are never evicted:
the load then waits up to ``queue_timeout_s`` for room (the capacity wait) and fails
with 503 ``CapacityTimeout``.

GPUs (local workers, ``control/placement/gpus.py``): each GPU has its own budget, and a model
that uses one is placed on the GPU with the most free budget that holds its need;
when none does, the LRU idle models on the GPUs where that would make room are
evicted, by memory (not by count), under the same rules (busy, loading or pinned: never;
else the capacity wait, then 503 naming the GPU and the bytes).

Time slice (``model_time_slice_s`` > 0, for one model at a time): a model keeps its
place for that long after it loaded. Within it, it is not evicted even when idle (so
alternating users do not swap models per request); after it, while another model
waits for room, a busy model is unloaded too, drained first (its running requests
finish, up to ``drain_timeout_s``; its queued ones wait to load it again).

The admission lock is held only while deciding what to evict and starting workers,
never while serving, so loads never block requests to other models. Every start goes
through ``load``: a request's autoload, an explicit load, a restart after a config
change (reload) and a retry after a crash loop's backoff. Of the loads waiting for the
lock, the one whose request's key is furthest below its share goes next (load_gate.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from corral.control.placement.memory import estimate_bytes, memory_bytes
from corral.units import fmt_bytes
from corral.config.file import ServerConfig
from corral.control.placement.gpu_slot import GpuSlot
from corral.control.placement.gpus import GpuBudget, Shortage, device_use
from corral.control.scheduling.load_gate import LoadGate
from corral.control.scheduling.pool import ModelPool
from corral.errors import CapacityTimeout, LoadFailed
from corral.store.gguf import check_file

__all__ = ["Admission"]

log = logging.getLogger("corral.admission")

Background = Callable[[Coroutine[Any, Any, None], str], object]


def _gpu_why(short: Shortage) -> str:
    return (f"{short.device} has {fmt_bytes(short.free_bytes)} free of its budget "
            f"{fmt_bytes(short.budget_bytes)}, the model needs {fmt_bytes(short.need_bytes)}")


class Admission:
    def __init__(self, pools: dict[str, ModelPool], server: Callable[[], ServerConfig],
                 background: Background, node_room: Callable[[ModelPool], str | None] | None = None,
                 gpus: GpuBudget | None = None,
                 serving: Callable[[ModelPool], ModelPool] = lambda pool: pool) -> None:
        self._pools = pools
        self._serving = serving  # the pool whose instances serve a pool's requests (ControlPlane.serving)
        self.gpus = gpus  # local workers: the GPU inventory, per-device budget and placement
        self.node_room = node_room  # on a Ray cluster: why no node has room for the pool, or None
        self._server = server
        self._background = background
        # the admission lock; a waiting load is let in by its key's share, not first come (load_gate.py)
        self._lock = LoadGate(lambda key: sum(p.waiters.busy_of(key) for p in self._pools.values()))
        self._capacity: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ loading

    async def load(self, pool: ModelPool, *, fresh: bool = True) -> ModelPool:
        """Start the model that serves ``pool`` (making room first) unless it already holds
        its place; wait until an instance is ready; return it. That model is ``pool``, or one
        ``pool`` is a variant of (``ControlPlane.serving``: loaded or loading, equal in all a
        load fixes), decided again under the lock that starts it: of two variants' first
        requests at once, the second rides on the load the first started (no second load).
        ``fresh=False``: failed instances retry with their failure counts (after a crash
        loop's backoff). LoadFailed for a file that does not read as GGUF (checked again
        here, off the event loop: it may have changed since the catalog was read); nothing
        is started for it."""
        serving = self._serving(pool)
        if not serving.occupies and self._server().worker_command is None:
            problem = (await asyncio.to_thread(check_file, serving.spec.path)).problem
            if problem is not None:
                raise LoadFailed(f"model {serving.spec.id!r} failed: its file does not read as GGUF: {problem}")
        if not serving.occupies:
            async with self._lock.turn():
                serving = self._serving(pool)  # a variant's host may have started while this waited
                if not serving.occupies:
                    placed = await self._make_room(serving)
                    serving.start(fresh=fresh, gpus=placed)
        await serving.wait_ready(self._server().load_timeout_s)
        if self._server().memory_budget is not None:
            self._background(self._trim(serving), "trim")
        return serving

    async def _make_room(self, pool: ModelPool) -> list[GpuSlot] | None:
        """Evict LRU idle models until ``pool`` fits (count, host memory, GPU memory);
        wait for room up to queue_timeout_s. Returns where its instances go on the GPUs."""
        srv = self._server()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + srv.queue_timeout_s
        budget = srv.memory_budget
        need = estimate_bytes(pool)
        if budget is not None and need > budget:
            raise LoadFailed(f"model {pool.spec.id!r} needs about {fmt_bytes(need)}, more than "
                             f"memory_budget ({fmt_bytes(budget)})")
        gpus = self.gpus
        if gpus is not None:
            await gpus.inventory()
            gpus.learn(self._pools.values())
            if not gpus.uses_gpu(pool):
                gpus = None
        gpu_need = await gpus.need(pool) if gpus is not None else []
        while True:
            others = [p for p in self._pools.values() if p is not pool and p.occupies]
            over_count = len(others) + 1 > srv.max_loaded_models
            used = sum(memory_bytes(p) for p in others)
            over_mem = budget is not None and used + need > budget
            placed = gpus.place(pool, gpu_need, others) if gpus is not None else None
            short = placed if isinstance(placed, Shortage) else None
            no_node = None if over_count or over_mem or self.node_room is None else self.node_room(pool)
            if not over_count and not over_mem and short is None and no_node is None:
                return placed if isinstance(placed, list) else None
            victims = sorted((p for p in others if p.evictable and not self._in_slice(p)), key=lambda p: p.last_used)
            if short is not None and not over_count and not over_mem:
                victims = [p for p in victims if short.helpful & device_use(p).keys()]
            if victims:
                why = (f"max_loaded_models={srv.max_loaded_models}" if over_count
                       else f"memory_budget={fmt_bytes(budget or 0)}" if over_mem
                       else _gpu_why(short) if short is not None else "no room on any node")
                await self.unload(victims[0], f"evicted to make room for {pool.spec.id} ({why})",
                                  drain=False)
                continue
            spent = [p for p in others if self._slice_spent(p)]
            if spent and (over_count or over_mem):
                await self.unload(min(spent, key=lambda p: p.loaded_at),
                                  f"time slice over: {pool.spec.id} waits for room", drain=True)
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                what = (f"{len(others)} models loaded (max_loaded_models={srv.max_loaded_models})"
                        if over_count else
                        f"{fmt_bytes(used)} of memory_budget {fmt_bytes(budget or 0)} in use" if over_mem
                        else _gpu_why(short) if short is not None else str(no_node))
                raise CapacityTimeout(f"no room to load model {pool.spec.id!r}: {what} and none "
                                      "can be evicted (busy, loading or pinned); try again later",
                                      retry_after_s=5)
            await self._wait_capacity(min([remaining] + self._slice_ends(others)))

    def _in_slice(self, p: ModelPool) -> bool:
        return time.monotonic() - p.loaded_at < self._server().model_time_slice_s

    def _slice_spent(self, p: ModelPool) -> bool:
        """Past its time slice and busy: it yields, drained, to a model waiting for room."""
        return (self._server().model_time_slice_s > 0 and not self._in_slice(p) and not p.pinned
                and not p.draining and p.has_ready and not p.idle)

    def _slice_ends(self, others: list[ModelPool]) -> list[float]:
        """Seconds until each time slice running now ends (then a wait for room looks again)."""
        left = [self._server().model_time_slice_s - (time.monotonic() - p.loaded_at) for p in others]
        return [max(x, 0.01) for x in left if x > 0]

    async def _trim(self, loaded: ModelPool) -> None:
        """After a load, with real numbers: evict LRU idle models while over budget."""
        budget = self._server().memory_budget
        if budget is None:
            return
        async with self._lock.turn():
            while True:
                active = [p for p in self._pools.values() if p.occupies]
                if sum(memory_bytes(p) for p in active) <= budget:
                    return
                victims = sorted((p for p in active if p is not loaded and p.evictable),
                                 key=lambda p: p.last_used)
                if not victims:
                    log.warning("over memory_budget after loading %s; nothing idle to evict", loaded.spec.id)
                    return
                await self.unload(victims[0], f"evicted: over memory_budget after loading "
                                  f"{loaded.spec.id}", drain=False)

    # ------------------------------------------------------------------ unloading

    async def unload(self, pool: ModelPool, reason: str, *, drain: bool,
                     waiters_exc: Exception | None = None) -> None:
        """Stop the pool's workers (after its running requests, up to drain_timeout_s,
        when ``drain``). Its queued requests get ``waiters_exc``, or retry from the top."""
        pool.draining = True
        try:
            if drain and pool.inflight:
                await pool.wait_idle(self._drain_s(pool))
            await pool.stop(reason)
        finally:
            pool.draining = False
            if waiters_exc is not None:
                pool.fail_waiters(waiters_exc)
            else:
                pool.wake_waiters()
            self.notify_capacity()

    def _drain_s(self, pool: ModelPool) -> float:
        """How long an unload waits for running requests: the model's own, else the server's."""
        own = pool.spec.drain_timeout_s
        return own if own is not None else self._server().drain_timeout_s

    async def unload_idle(self, pool: ModelPool, reason: str) -> None:
        """Unload only if still idle when this runs (a request may have come meanwhile);
        the check and the draining flag happen with no await in between."""
        if not pool.idle or pool.draining or not pool.occupies:
            return
        await self.unload(pool, reason, drain=False)

    async def restart(self, pool: ModelPool, apply: Callable[[], None]) -> None:
        """New worker settings: drain and stop the workers, ``apply`` the new spec, and
        load again (within the budget) if it was loaded. Requests arriving meanwhile
        queue and are served by the new workers. Raises when the new load fails."""
        was_active = pool.occupies
        pool.draining = True
        try:
            if was_active:
                await pool.wait_idle(self._drain_s(pool))
                await pool.stop("config changed: restarting with new settings")
            pool.forget_failure()
            apply()
        finally:
            pool.draining = False
            self.notify_capacity()
        if was_active:
            await self.load(pool)
        elif pool.waiters:
            pool.wake_waiters()

    # ------------------------------------------------------------------ capacity wait

    @property
    def waits_for_room(self) -> bool:
        """A load waits for room now (the capacity wait)."""
        return self._capacity is not None and not self._capacity.done()

    def notify_capacity(self) -> None:
        c = self._capacity
        if c is not None and not c.done():
            c.set_result(None)

    async def _wait_capacity(self, timeout_s: float) -> None:
        if self._capacity is None or self._capacity.done():
            self._capacity = asyncio.get_running_loop().create_future()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._capacity), timeout_s)
