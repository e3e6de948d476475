"""A model's instances, its slots and its fair queue: where a request goes.

A request takes a free slot on a ready instance: the one that recently served the
longest common prompt prefix (at least ``MIN_PREFIX`` characters: the worker can reuse
that KV cache), then the least busy one. With no free slot it waits in a bounded queue
(``max_queue``; full -> ``QueueFull``), weighted fair over keys (``corral.control.scheduling.fair_queue``);
a key over its share may be paused for a waiting one (``corral.control.scheduling.preempt``).
A draining pool (being unloaded or restarted) hands out no slots; its waiters wait for it
to come back, or are told to retry (the model was unloaded: autoload again).

The pool keeps its own slot bookkeeping (``_Slots`` per instance: busy slots, recent
prompt prefixes, last use); an instance leaving ``ready`` has its count zeroed (its
requests were failed). All on the event loop, synchronous but the waits: no races.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral import wire
from corral.config.file import ServerConfig
from corral.control.catalog import ModelSpec
from corral.control.scheduling.fair_queue import ANONYMOUS, DEFAULT_AGING_S, FairQueue, Requester, Waiter
from corral.control.placement.gpu_slot import GpuSlot
from corral.control.instance.instance import Instance, InstanceState, Transition
from corral.control.scheduling.preempt import Preemptor
from corral.control.scheduling.prefixes import MIN_PREFIX, PREFIX_KEY_CHARS, best_for_prefix, common_prefix_len
from corral.errors import CapacityTimeout, LoadFailed, ModelLoading, ModelUnloaded, QueueFull

if TYPE_CHECKING:
    from corral.control.stream import RequestStream

__all__ = ["ModelPool", "MIN_PREFIX", "common_prefix_len"]

S = InstanceState


@dataclass(slots=True)
class _Slots:
    busy: int = 0
    recent: deque[str] = field(default_factory=deque)
    last_used: float = 0.0


class ModelPool:
    def __init__(self, spec: ModelSpec, *, make_instance: Callable[["ModelPool", int], Instance],
                 on_capacity: Callable[[], None],
                 server: Callable[[], ServerConfig] | None = None) -> None:
        self.spec = spec
        self._make_instance = make_instance
        self._on_capacity = on_capacity
        self.instances: list[Instance] = []
        self._slots: dict[Instance, _Slots] = {}
        self.waiters = FairQueue(lambda: server().priority_aging_s if server else DEFAULT_AGING_S)
        self.preempt = Preemptor(self, server)  # fair-share preemption (control/scheduling/preempt.py)
        self.last_used = 0.0
        self.draining = False
        self.footprint: int | None = None  # per-instance bytes, as last reported (placement/memory.py)
        self.loads, self.loaded_at = 0, 0.0  # starts; time.monotonic() of the last
        # Ollama's keep_alive from the latest request: None = spec.ttl_s, 0 = unload when
        # idle, > 0 = idle seconds before unloading, < 0 = stay loaded. Reset on each load.
        self.keep_alive_s: float | None = None
        self.lora_defaults: list[wire.LoraScale] | None = None  # POST /lora-adapters' (api/core/lora.py)
        self._changed: asyncio.Future[None] | None = None
        self._idle: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ state
    @property
    def has_ready(self) -> bool:
        return any(i.state is S.READY for i in self.instances)

    def busy(self, inst: Instance) -> int:
        """Slots of ``inst`` running a request."""
        return self._slots[inst].busy if inst in self._slots else 0

    def recent(self, inst: Instance) -> deque[str]:
        """Prompt prefixes ``inst`` served lately (prefix affinity)."""
        return self._slots[inst].recent if inst in self._slots else deque()

    def last_used_of(self, inst: Instance) -> float:
        return self._slots[inst].last_used if inst in self._slots else 0.0

    def _free_slots(self, inst: Instance) -> int:
        return inst.slots_total - self._slots[inst].busy if inst.accepting else 0

    @property
    def occupies(self) -> bool:
        """Counts against max_loaded_models / memory_budget."""
        return any(i.holds_memory for i in self.instances)

    @property
    def failed_final(self) -> bool:
        return bool(self.instances) and all(i.state is S.FAILED and i.final and not i.holds_memory
                                            for i in self.instances)

    @property
    def retry_due(self) -> bool:
        """Failed for good after a crash loop, and the backoff has passed: a request may
        start it again."""
        return self.failed_final and any(i.retry_due for i in self.instances)

    @property
    def failure_reason(self) -> str | None:
        """Why its last load failed, else why its file does not read (``spec.problem``)."""
        for i in self.instances:
            if i.state is S.FAILED and i.reason:
                return i.reason
        return self.spec.problem

    @property
    def inflight(self) -> int:
        return sum(s.busy for s in self._slots.values()) + self.preempt.paused

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and not self.waiters

    @property
    def evictable(self) -> bool:
        return (self.occupies and not self.pinned and self.idle and not self.draining
                and all(i.state in (S.READY, S.FAILED) for i in self.instances))

    @property
    def pinned(self) -> bool:
        """Never evicted, no idle unload: configured so, or a negative keep_alive."""
        return self.spec.pinned or (self.keep_alive_s is not None and self.keep_alive_s < 0)

    @property
    def ttl_s(self) -> float | None:
        """Idle seconds before unloading (None: never): keep_alive, else the spec's ttl_s;
        a model pinned in the config stays pinned whatever a request asks."""
        ka = self.keep_alive_s
        if self.spec.pinned or (ka is not None and ka < 0):
            return None
        return self.spec.ttl_s if ka is None else ka

    def status(self) -> str:
        states = {i.state for i in self.instances}
        if S.READY in states or S.STOPPING in states:
            return "loaded"
        if any(i.holds_memory for i in self.instances):  # starting, or about to
            return "loading"
        if S.FAILED in states or self.spec.problem is not None:
            return "failed"  # a load failed, or its file does not read as GGUF
        return "unloaded"

    def live(self) -> list[Instance]:
        """The instances that take memory: starting, ready, stopping, or about to start."""
        return [i for i in self.instances if i.holds_memory]

    # ------------------------------------------------------------------ lifecycle
    def start(self, *, fresh: bool = True, gpus: list[GpuSlot] | None = None) -> None:
        """Tell every instance to start (does not wait). ``fresh``: new instances from
        the current spec, earlier failures forgotten; else the failed ones try again
        with their failure counts (a retry after the backoff). ``gpus``: where admission
        placed each instance."""
        self.loads += 1
        self.keep_alive_s = None
        self.last_used = time.time()
        self.loaded_at = time.monotonic()  # its time slice (admission) starts
        fresh = fresh or not self.instances
        if fresh:
            self._replace([self._make_instance(self, i) for i in range(self.spec.instances)])
        for k, inst in enumerate(self.instances):
            gpu = gpus[k] if gpus is not None and k < len(gpus) else None
            if fresh:
                inst.request_start(reset=True, gpu=gpu)
            elif inst.state in (S.FAILED, S.STOPPED):
                inst.request_start(gpu=gpu)

    def forget_failure(self) -> None:
        """A model that failed for good goes back to unloaded (reload)."""
        if self.failed_final:
            self._replace([])

    def discard(self) -> None:
        """Forget every instance (the model is removed or the router closes)."""
        self._replace([])

    def _replace(self, instances: list[Instance]) -> None:
        for old in self.instances:
            old.discard()
        self.instances = instances
        self._slots = {i: _Slots(recent=deque(maxlen=max(2, 2 * (self.spec.slots_asked() or self.spec.n_parallel_max))))
                       for i in instances}

    async def stop(self, reason: str) -> None:
        await asyncio.gather(*(i.stop(reason) for i in self.instances))

    async def wait_ready(self, timeout_s: float) -> None:
        """Until an instance is ready. LoadFailed when all failed for good;
        ModelNotLoaded when the model was stopped meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.has_ready:
                return
            if self.failed_final:
                raise LoadFailed(f"{self.spec.id} failed to load: {self.failure_reason}")
            if not self.occupies:
                raise ModelUnloaded(f"model {self.spec.id!r} was unloaded while loading",
                                    retry_after_s=1)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ModelLoading(f"model {self.spec.id!r} is still loading after {timeout_s:g} s",
                                   retry_after_s=5)
            if self._changed is None or self._changed.done():
                self._changed = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._changed), remaining)
            except asyncio.TimeoutError:
                pass

    async def wait_idle(self, timeout_s: float) -> bool:
        """Until no request runs on any instance (queued ones may wait). False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.preempt.resume_all()  # paused requests finish too
        while self.inflight > 0:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._idle is None or self._idle.done():
                self._idle = loop.create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._idle), remaining)
            except asyncio.TimeoutError:
                return False
        return True

    def on_instance_change(self, inst: Instance, tr: Transition) -> None:
        """Called (synchronously) by an instance after each transition."""
        slots = self._slots.get(inst)
        if slots is None:
            return  # a discarded instance
        if tr.new is not S.READY:
            slots.busy = 0  # its requests were failed or are being stopped
        if inst.state is S.READY:
            slots.last_used = time.time()
            if inst.memory_bytes is not None:
                self.footprint = inst.memory_bytes
            self._serve_waiters()
        elif self.failed_final:
            self.fail_waiters(LoadFailed(f"{self.spec.id} failed to load: {self.failure_reason}"))
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
        if self.inflight == 0:
            self._set_idle()
        self._on_capacity()

    # ------------------------------------------------------------------ slots
    def try_acquire(self, prefix: str | None, who: Requester = ANONYMOUS) -> Instance | None:
        """A reserved slot now, or None (no free slot, queue not empty, or draining); it
        counts for ``who`` until ``track``'s stream ends (or ``unreserve``)."""
        if self.draining or self.waiters:
            return None
        inst = self._pick(prefix)
        if inst is not None:
            self.waiters.started(who.key, who.weight)
        return inst

    def track(self, stream: RequestStream, who: Requester, inst: Instance | None = None) -> None:
        """At the end of ``who``'s request: a busy slot less, its tokens served (``inst``: preemptible)."""
        self.waiters.track(stream, who.key)
        if inst is not None:
            self.preempt.track(stream, inst, who)

    def unreserve(self, inst: Instance, who: Requester = ANONYMOUS) -> None:
        """A slot taken for ``who`` was not used (the send failed)."""
        self.waiters.ended(who.key, 0)
        self.release(inst)

    async def wait_slot(self, prefix: str | None, who: Requester, *, max_queue: int,
                        deadline: float | None) -> Instance | None:
        """Queue for a slot (no ``deadline``: until its client leaves). The instance (slot reserved) or None: retry."""
        if len(self.waiters) >= max_queue:
            raise QueueFull(f"model {self.spec.id!r} has {len(self.waiters)} requests waiting "
                            f"(max_queue={max_queue}); try again later", retry_after_s=1)
        loop = asyncio.get_running_loop()
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            raise CapacityTimeout(f"no free slot on model {self.spec.id!r} in time", retry_after_s=1)
        fut: asyncio.Future[Instance | None] = loop.create_future()
        entry = self.waiters.push(fut, prefix, who.key, who.weight, who.priority)
        self.preempt.check_soon()
        try:
            return await asyncio.wait_for(fut, remaining)
        except asyncio.TimeoutError:
            raise CapacityTimeout(f"no free slot on model {self.spec.id!r} within [server] request_queue_timeout_s",
                                  retry_after_s=1) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                got = fut.result()
                if got is not None:
                    self.unreserve(got, who)
            raise
        finally:
            if fut.cancelled():  # timed out or the caller left: still queued (served ones were popped)
                self.waiters.remove(entry)
            if not self.waiters and self.inflight == 0:
                self._on_capacity()

    def release(self, inst: Instance) -> None:
        """A request ended on ``inst`` (called from the link), or was never sent."""
        slots = self._slots.get(inst)
        if slots is None:
            return
        if slots.busy > 0:
            slots.busy -= 1
        self.last_used = slots.last_used = time.time()
        if self.waiters:
            self._serve_waiters()
        if self.inflight == 0:
            self._set_idle()
            if not self.waiters:
                self._on_capacity()

    def wake_waiters(self) -> None:
        """Tell every waiter to retry from the top (the model was unloaded)."""
        for w in self.waiters.take_all():
            if not w.fut.done():
                w.fut.set_result(None)

    def fail_waiters(self, exc: Exception) -> None:
        for w in self.waiters.take_all():
            if not w.fut.done():
                w.fut.set_exception(exc)

    def _serve_waiters(self) -> None:
        while not self.draining:
            w: Waiter | None = self.waiters.next()
            if w is None:
                return
            if w.fut.done():
                self.waiters.remove(w)
                continue
            inst = self._pick(w.prefix) if w.instance is None else self.hold_slot(w.instance, free_only=True)
            if inst is None:
                return
            self.waiters.serve(w)
            w.fut.set_result(inst)

    def hold_slot(self, inst: Instance, *, free_only: bool = False) -> Instance | None:
        if inst not in self._slots or (free_only and self._free_slots(inst) <= 0):
            return None
        self._slots[inst].busy += 1
        return inst

    def _pick(self, prefix: str | None) -> Instance | None:
        candidates = [i for i in self.instances if self._free_slots(i) > 0]
        if not candidates:
            return None
        best = best_for_prefix(candidates, prefix, lambda i: self._slots[i].busy, lambda i: self._slots[i].recent)
        slots = self._slots[best]
        slots.busy += 1
        if prefix:
            slots.recent.append(prefix[:PREFIX_KEY_CHARS])
        self.last_used = slots.last_used = time.time()
        return best

    def _set_idle(self) -> None:
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)
