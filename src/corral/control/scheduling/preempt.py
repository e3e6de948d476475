"""Fair-share preemption: while other keys wait for a model's slots, a key holds at most
its share of them; a sequence of a key over its share is paused between decode steps
(``wire.Preempt`` -> ``wire.Paused``, the worker keeps its state: worker/preempt/preemption.py) and
its slot goes to the waiting key. It resumes (``wire.Resume``) on the same instance when
the fair queue gives its key a slot there again. See docs/internals/fair-share.md.

The decision (``check``, after a request queued): the keys active on the model (a running
or waiting request) share its slots by weight, ``share = slots * weight / sum(weights)``.
While a key with waiters holds at most ``share - 1`` (room for one more within its
share) and another key holds more than its share, the over-share key's sequence that
started (or resumed) last is paused, one per waiting request that fits a share. A resumed
sequence is not paused again for ``preempt_min_run_s`` (no thrashing); when only such
ones are over, the check runs again as their time ends.

The slot bookkeeping stays the pool's: a request gives its slot back as Preempt is sent
(``ModelPool.release``, its key one busy slot less: the waiting request goes out right
behind the Preempt, and the worker, reading both in order, starts it in the same step;
a ``Paused(paused=False)`` takes the slot back) and waits in the fair queue as a
waiter bound to its instance, ahead of its key's new requests; served, its slot is
reserved as for any request and ``Resume`` is sent. A paused request that ends (abort,
its worker died) first takes its accounting back, so the usual end balances it. A
draining pool resumes every paused request at once (they must finish before it stops).

Everything runs on the event loop, synchronously.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from corral import wire
from corral.control.scheduling.fair_queue import FairQueue, Requester, Waiter

if TYPE_CHECKING:
    from corral.config.file import ServerConfig
    from corral.control.instance.instance import Instance
    from corral.control.stream import RequestStream

__all__ = ["Preemptor", "PreemptStats"]

log = logging.getLogger("corral.preempt")

DEFAULT_MIN_RUN_S = 1.0


class ModelPool(Protocol):
    """What this needs of ``corral.control.scheduling.pool.ModelPool`` (which imports this module)."""

    waiters: FairQueue
    instances: list[Instance]
    draining: bool

    def busy(self, inst: Instance) -> int: ...

    def release(self, inst: Instance) -> None: ...

    def hold_slot(self, inst: Instance, *, free_only: bool = False) -> Instance | None: ...


class _State(enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"  # Preempt sent (its slot handed over); waits in the fair queue
    RESERVED = "reserved"  # served: its slot is reserved, Resume about to go out
    DONE = "done"


@dataclass(eq=False, slots=True)
class _Run:
    stream: RequestStream
    inst: Instance
    key: str
    weight: float
    priority: int
    since: float  # monotonic: started or last resumed
    resumed: bool = False
    state: _State = _State.RUNNING
    paused_at: float = 0.0
    waiter: Waiter | None = None


@dataclass(slots=True)
class PreemptStats:
    """Per key: pauses, seconds paused (ended pauses), pauses whose KV was kept."""

    pauses: dict[str, int] = field(default_factory=dict)
    paused_s: dict[str, float] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)

    def view(self, paused_now: int) -> dict[str, Any]:
        return {"pauses": sum(self.pauses.values()), "paused_now": paused_now,
                "kv_kept": sum(self.kept.values()), "paused_seconds": round(sum(self.paused_s.values()), 3),
                "keys": {k: {"pauses": n, "kv_kept": self.kept.get(k, 0),
                             "paused_seconds": round(self.paused_s.get(k, 0.0), 3)}
                         for k, n in sorted(self.pauses.items())}}


class Preemptor:
    def __init__(self, pool: ModelPool, server: Callable[[], ServerConfig] | None = None) -> None:
        self.pool = pool
        self._server = server  # [server] preempt, preempt_min_run_s
        self._runs: dict[str, _Run] = {}
        self.stats = PreemptStats()
        self._check_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def paused(self) -> int:
        """Requests paused (they hold no slot, but are in flight)."""
        return sum(1 for r in self._runs.values() if r.state is _State.PAUSED)

    # ------------------------------------------------------------------ what the pool calls

    def track(self, stream: RequestStream, inst: Instance, who: Requester) -> None:
        """A generation of ``who`` runs on ``inst``; call after ``FairQueue.track`` (this end
        handler runs first, before the queue's)."""
        if stream.done:
            return
        run = _Run(stream, inst, who.key, who.weight, who.priority, time.monotonic())
        self._runs[stream.id] = run
        stream.on_pause = lambda msg: self._on_paused(run, msg)
        stream.at_end(lambda _: self._ended(run))

    def check_soon(self) -> None:
        """Look at the shares once the current callback is done (a request just queued)."""
        if self._check_handle is None:
            self._check_handle = asyncio.get_running_loop().call_soon(self._check)

    def resume_all(self) -> None:
        """Resume every paused request now (the pool drains: they must finish)."""
        for run in list(self._runs.values()):
            if run.state is _State.PAUSED:
                self._take_back(run)
                self._resume(run)

    # ------------------------------------------------------------------ the decision

    def _check(self) -> None:
        self._check_handle = None
        srv = self._server() if self._server is not None else None
        on, min_run_s = (srv.preempt, srv.preempt_min_run_s) if srv is not None else (True, DEFAULT_MIN_RUN_S)
        pool = self.pool
        if not on or pool.draining or not pool.waiters:
            return
        accepting = [i for i in pool.instances if i.accepting]
        if any(pool.busy(i) < i.slots_total for i in accepting):
            return  # a free slot: the queue is being served
        slots = sum(i.slots_total for i in accepting)
        fq = pool.waiters
        waiting: dict[str, int] = {}
        weights: dict[str, float] = {}
        for w in fq:
            if w.instance is None:
                waiting[w.key] = waiting.get(w.key, 0) + 1
        running: dict[str, list[_Run]] = {}
        for run in self._runs.values():
            weights[run.key] = run.weight
            if run.state is _State.RUNNING:
                running.setdefault(run.key, []).append(run)
        for key in waiting:
            weights.setdefault(key, fq.weight_of(key))
        holds = {k: fq.busy_of(k) for k in weights}
        total_w = sum(weights[k] for k in weights if holds.get(k, 0) > 0 or waiting.get(k, 0) > 0)
        if total_w <= 0:
            return
        share = {k: slots * weights[k] / total_w for k in weights}
        now = time.monotonic()
        next_free: float | None = None
        while True:
            starved = [k for k, n in waiting.items() if n > 0 and holds.get(k, 0) + 1 <= share[k] + 1e-9]
            over = sorted((k for k in running if holds.get(k, 0) > share[k] + 1e-9),
                          key=lambda k: holds[k] / weights[k], reverse=True)
            if not starved or not over:
                break
            victim: _Run | None = None
            for k in over:
                free = [r for r in running[k] if not r.resumed or now - r.since >= min_run_s]
                for r in running[k]:
                    if r.resumed and now - r.since < min_run_s:
                        t = r.since + min_run_s - now
                        next_free = t if next_free is None else min(next_free, t)
                if free:
                    victim = max(free, key=lambda r: r.since)
                    break
            if victim is None:
                break
            running[victim.key].remove(victim)
            holds[victim.key] -= 1
            k = min(starved, key=lambda k: holds.get(k, 0) / weights[k])
            holds[k] = holds.get(k, 0) + 1
            waiting[k] -= 1
            self._preempt(victim)
        if next_free is not None and (self._timer is None or self._timer.when() <= asyncio.get_running_loop().time()):
            self._timer = asyncio.get_running_loop().call_later(next_free + 0.01, self.check_soon)

    def _preempt(self, run: _Run) -> None:
        """Send Preempt and hand the slot over at once: the worker reads the frames in order,
        so the waiting request sent right behind it finds the slot free in the same step."""
        send = run.stream.send
        if send is None or not send(wire.Preempt(run.stream.id)):
            return
        log.debug("preempting %s (key %s) on %s", run.stream.id, run.key, run.inst.name)
        pool = self.pool
        run.state = _State.PAUSED
        run.paused_at = time.monotonic()
        self.stats.pauses[run.key] = self.stats.pauses.get(run.key, 0) + 1
        fut: asyncio.Future[Instance | None] = asyncio.get_running_loop().create_future()
        run.waiter = pool.waiters.push(fut, None, run.key, run.weight, run.priority, instance=run.inst)
        fut.add_done_callback(lambda f: self._served(run, f))
        pool.waiters.ended(run.key, 0)  # its slot is not its key's any more ...
        pool.release(run.inst)  # ... and goes to the queue (the waiting key first)

    # ------------------------------------------------------------------ the worker's answers

    def _on_paused(self, run: _Run, msg: wire.Paused) -> None:
        if msg.paused:
            self.stats.kept[run.key] = self.stats.kept.get(run.key, 0) + int(msg.kept_kv)
        elif run.state is _State.PAUSED:  # it could not be paused: it runs on, and takes its slot back
            self.stats.pauses[run.key] -= 1
            self._take_back(run)
            run.state, run.waiter = _State.RUNNING, None

    def _served(self, run: _Run, fut: asyncio.Future[Instance | None]) -> None:
        if run.state is not _State.PAUSED:
            return
        got = None if fut.cancelled() or fut.exception() is not None else fut.result()
        if got is None:  # the queue was emptied (the model goes away): resume to finish
            self._take_back(run)
        self._resume(run)

    def _resume(self, run: _Run) -> None:
        now = time.monotonic()
        self.stats.paused_s[run.key] = self.stats.paused_s.get(run.key, 0.0) + now - run.paused_at
        run.state, run.since, run.resumed, run.waiter = _State.RUNNING, now, True, None
        send = run.stream.send
        if send is not None:
            send(wire.Resume(run.stream.id))

    def _take_back(self, run: _Run) -> None:
        """A paused request takes its slot's accounting back (without a free slot): it is
        about to resume or to end, and its end gives one back."""
        w, run.state = run.waiter, _State.RESERVED
        if w is not None and w.fut.done() and not w.fut.cancelled() and w.fut.exception() is None \
                and w.fut.result() is not None:
            return  # served already: its slot is reserved
        if w is not None:
            self.pool.waiters.remove(w)
            if not w.fut.done():
                w.fut.cancel()
        self.pool.waiters.started(run.key, run.weight)
        self.pool.hold_slot(run.inst)

    def _ended(self, run: _Run) -> None:
        self._runs.pop(run.stream.id, None)
        if run.state is _State.PAUSED:
            self.stats.paused_s[run.key] = self.stats.paused_s.get(run.key, 0.0) + time.monotonic() - run.paused_at
            self._take_back(run)
        run.state = _State.DONE
