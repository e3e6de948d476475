"""One model instance and the one task that owns its state.

States (``InstanceState``) and what each command does in them:

    state      start                    stop                      worker exits
    stopped    spawn -> starting        nothing                   -
    starting   wait for Ready           Shutdown -> stopping      -> failed (+restart?)
    ready      nothing                  Shutdown -> stopping      -> failed (+restart?)
    stopping   start again once stopped wait                      -> stopped
    failed     spawn -> starting        -> stopped                -

Only the owner task (``_own``) changes state; callers and the link of the current spawn
(``corral.control.transport.link``; news from an earlier link is ignored) put items in its inbox
(a start carries the GPU placement admission chose). What a pending start is about to do is
read from the inbox: ``holds_memory`` and ``gpu`` count it before the owner gets to it.
Every transition is checked against ``ALLOWED``, published as ``status_change`` and
passed to ``on_change``. Requests bypass the owner: the link hands their messages to the
``RequestStream`` and reports a freed slot to ``on_slot_free`` (the pool counts slots).
A crash fails in-flight requests with ``WorkerCrashed``; the ``RestartPolicy`` decides
whether and when it restarts. See docs/internals/control-plane.md, "Instance state machine".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from corral import wire
from corral.control.catalog import ModelSpec
from corral.control.placement.gpu_slot import GpuSlot
from corral.events import EventBus, EventName
from corral.control.instance.state import (ALLOWED, InstanceState, Timeouts, Transition, failure_reason,
                                           status_fields)
from corral.control.instance.inbox import (KEPT, Closed, Discard, Exited, Inbox, Kept, Lifecycle, LoadTimeout,
                                           RestartDue, Start, Stop, consume, fail_all, resolve,
                                           resolve_all)
from corral.control.transport.link import (LifecycleMessage, LinkExit, Placement, Spawner, WorkerLink)
from corral.control.instance.restart import RestartPolicy
from corral.control.stream import RequestStream
from corral.errors import LoadFailed, Unavailable, WorkerCrashed

__all__ = ["InstanceState", "Instance", "Timeouts", "Transition"]

log = logging.getLogger("corral.instance")

S = InstanceState
_EXIT_AFTER_EOF_S = 1.0  # a worker whose channel closed must exit within this, or is killed


class Instance:
    def __init__(self, spec: ModelSpec, index: int, *, spawner: Spawner, timeouts: Timeouts,
                 policy: RestartPolicy, bus: EventBus, threads: int | None,
                 on_change: Callable[["Instance", Transition], None],
                 on_slot_free: Callable[["Instance"], None]) -> None:
        self.spec = spec
        self.index = index
        self.name = f"{spec.id}#{index}"
        self.threads = threads
        self._spawner = spawner
        self._timeouts = timeouts
        self._policy = policy
        self._bus = bus
        self._on_change = on_change
        self._on_slot_free = on_slot_free

        # read by the pool and the views; written only by the owner task
        self.state = InstanceState.STOPPED
        self.pid: int | None = None
        self.placement = Placement()
        self._gpu: GpuSlot | None = None  # see ``gpu``
        self.reason: str | None = None
        self.exit_code: int | None = None
        self.info: wire.ModelInfo | None = None
        self.restarts = 0  # restarts performed after crashes, lifetime
        self.final = False  # failed and no restart will follow
        self.restart_pending = False
        self.last_load_s: float | None = None

        self._link: WorkerLink | None = None
        self._discarded = False
        self._inbox = Inbox()
        self._load_started = 0.0
        self._load_error: str | None = None
        self._start_waiters: list[asyncio.Future[None]] = []
        self._stop_waiters: list[asyncio.Future[None]] = []
        self._start_after_stop = False
        self._stop_reason = "stopped"
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._owner = asyncio.get_running_loop().create_task(self._own(), name=f"instance {self.name}")

    # ----------------------------------------------------------------- read-only views

    @property
    def holds_memory(self) -> bool:
        """Starting, ready, stopping, or about to start (a restart due, a start in the inbox)."""
        return self.state in (S.STARTING, S.READY, S.STOPPING) or self.restart_pending or self._inbox.start_pending

    @property
    def gpu(self) -> GpuSlot | None:
        """Where admission placed it (GPUs, need): a pending start's placement, else its own."""
        pending = self._inbox.pending_gpu()
        return self._gpu if pending is KEPT else pending

    @property
    def failures(self) -> int:
        return self._policy.failures

    @property
    def retry_due(self) -> bool:
        """Failed for good after a crash loop, and its backoff has passed."""
        return self.state is S.FAILED and self.final and self._policy.retry_due()

    @property
    def slots_total(self) -> int:
        return self.info.n_slots if self.info is not None else self.spec.n_parallel

    @property
    def accepting(self) -> bool:
        """Ready, and its channel can take a request."""
        link = self._link
        return self.state is S.READY and link is not None and link.is_open

    @property
    def ready_link(self) -> WorkerLink | None:  # its worker's link while READY (slot files: api/llamacpp)
        return self._link if self.state is S.READY else None

    @property
    def stats(self) -> wire.Stats | None:
        return self._link.stats if self._link is not None else None

    @property
    def log_path(self) -> str | None:
        link = self._link
        return str(link.log_path) if link is not None and link.log_path is not None else None

    @property
    def memory_bytes(self) -> int | None:
        """What the worker reported: weights + projector + KV cache (latest Stats, else Ready)."""
        rep, proj = self.stats or self.info, self.info.mmproj_bytes if self.info is not None else 0
        return rep.model_bytes + proj + rep.kv_bytes if rep is not None else None

    @property
    def rss_bytes(self) -> int | None:
        rep = self.stats or self.info
        return rep.rss_bytes if rep is not None else None

    # ----------------------------------------------------------------- commands

    def request_start(self, *, reset: bool = False, gpu: GpuSlot | None | Kept = KEPT) -> asyncio.Future[None]:
        """Ask for a start (does not wait). ``reset`` forgets earlier failures (an
        explicit load); ``gpu``: where admission placed it (KEPT: as before). The future
        ends when ready, or with ``LoadFailed``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.add_done_callback(consume)
        if self._discarded:
            fut.set_exception(Unavailable(f"{self.spec.id} was unloaded", retry_after_s=1))
            return fut
        self._inbox.put(Start(fut, reset, gpu))
        return fut

    async def stop(self, reason: str = "stopped") -> None:
        if self._discarded:
            return  # its owner ended (its worker was killed)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inbox.put(Stop(fut, reason))
        await fut

    def discard(self) -> None:
        """Forget this instance (a fresh one replaces it, or the router closes): the
        owner kills a worker still running, fails what waits, and ends."""
        if not self._discarded:
            self._discarded = True
            self._inbox.put(Discard())

    async def closed(self) -> None:
        """Until the owner task has ended (after ``discard``)."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._owner

    def submit(self, request_id: str, frame: bytes, stream: RequestStream, slotted: bool = True) -> bool:
        """Send an encoded request (sync; ``slotted=False``: it holds no slot). False when it cannot now."""
        link = self.ready_link
        return link is not None and link.submit(request_id, frame, stream, self.index, slotted)

    async def fetch_stats(self, timeout_s: float = 2.0) -> wire.Stats | None:
        link = self.ready_link
        return None if link is None else await link.fetch_stats(timeout_s)

    # ----------------------------------------------------------------- LinkOwner

    def link_message(self, link: WorkerLink, msg: LifecycleMessage) -> None:
        self._inbox.put(Lifecycle(link, msg))

    def link_request_ended(self, link: WorkerLink) -> None:
        if link is self._link:
            self._on_slot_free(self)

    def link_closed(self, link: WorkerLink) -> None:
        self._inbox.put(Closed(link))

    def link_exited(self, link: WorkerLink, exit: LinkExit) -> None:
        self._inbox.put(Exited(link, exit))

    # ----------------------------------------------------------------- the owner

    async def _own(self) -> None:
        while True:
            item = await self._inbox.get()
            if isinstance(item, Discard):
                self._discard()
                return
            try:
                await self._handle(item)
            except Exception:
                log.exception("%s: error handling %r", self.name, item)
            finally:
                self._inbox.handled(item)

    async def _handle(self, item: object) -> None:
        st = self.state
        if isinstance(item, Start):
            if item.reset:
                self._policy.reset()
            if item.gpu is not KEPT:
                self._gpu = item.gpu
            if st is S.READY:
                resolve(item.reply)
            elif st is S.STARTING:
                self._start_waiters.append(item.reply)
            elif st is S.STOPPING:
                self._start_waiters.append(item.reply)
                self._start_after_stop = True
            else:  # stopped or failed: start now (a pending restart is superseded)
                self._cancel_timers()
                self.restart_pending = False
                self._start_waiters.append(item.reply)
                await self._spawn()
        elif isinstance(item, Stop):
            self._on_stop(item)
        elif isinstance(item, RestartDue):
            if st is S.FAILED and self.restart_pending:
                self.restart_pending = False
                self.restarts += 1
                await self._spawn(restart=True)
        elif isinstance(item, (Lifecycle, Closed, Exited, LoadTimeout)):
            if item.link is self._link:  # else: news from an earlier worker
                self._on_link_news(item)

    def _on_stop(self, item: Stop) -> None:
        st = self.state
        if st is S.STOPPED:
            resolve(item.reply)
        elif st is S.FAILED:
            self._cancel_timers()
            self.restart_pending = False
            self._set(S.STOPPED, reason=item.reason)
            fail_all(self._start_waiters, Unavailable(f"{self.spec.id} was stopped: {item.reason}"))
            resolve(item.reply)
        elif st is S.STOPPING:
            self._stop_waiters.append(item.reply)
            if self._start_after_stop:  # the start that was to follow is called off
                self._start_after_stop = False
                fail_all(self._start_waiters, Unavailable(f"{self.spec.id} was stopped: {item.reason}"))
        else:  # starting or ready: ask, then insist
            self._stop_waiters.append(item.reply)
            self._stop_reason = item.reason
            self._set(S.STOPPING, reason=item.reason)
            fail_all(self._start_waiters,
                     Unavailable(f"{self.spec.id} was stopped while loading: {item.reason}"))
            if self._link is not None:
                self._spawn_task(self._link.shutdown(self._timeouts.stop_grace_s))

    def _on_link_news(self, item: Lifecycle | Closed | Exited | LoadTimeout) -> None:
        st = self.state
        link = item.link
        if isinstance(item, Lifecycle):
            self._on_lifecycle(link, item.msg)
        elif isinstance(item, Closed):
            if link.exit is None and st in (S.STARTING, S.READY, S.STOPPING):
                # the worker should be exiting; make sure of it
                self._timers.append(asyncio.get_running_loop().call_later(_EXIT_AFTER_EOF_S, link.kill))
        elif isinstance(item, Exited):
            self._on_exit(link, item.exit)
        elif st is S.STARTING:  # LoadTimeout
            self._load_error = f"load did not finish within load_timeout_s={self._timeouts.load_timeout_s:g}"
            link.kill()

    def _on_lifecycle(self, link: WorkerLink, msg: LifecycleMessage) -> None:
        if isinstance(msg, wire.Loading):
            self.placement = link.placement  # a remote link learns the worker's pid from Loading
            self.pid = self.placement.pid or msg.pid
            if msg.protocol != wire.PROTOCOL_VERSION:
                self._load_error = (f"the worker speaks wire protocol {msg.protocol}, the router "
                                    f"{wire.PROTOCOL_VERSION}: mismatched corral installations")
                link.kill()
        elif isinstance(msg, wire.Ready):
            if self.state is not S.STARTING or self._load_error is not None:
                return  # (a worker already refused is being killed)
            self.info = msg.info
            self.last_load_s = time.monotonic() - self._load_started
            self._policy.on_ready()
            self._cancel_timers()
            self._set(S.READY)
            resolve_all(self._start_waiters)
        else:
            self._load_error = msg.reason

    async def _spawn(self, *, restart: bool = False) -> None:
        self._load_error = None
        self.info = None
        self.exit_code = None
        self.reason = None
        self.final = False
        self._load_started = time.monotonic()
        settings = self.spec.worker_settings(self.index, self.threads, self._gpu)
        try:
            link = await self._spawner.spawn(settings, self)
        except OSError as exc:  # final, unless the spawner says a later try may work (Ray: no room now)
            self._set(S.STARTING, restart=restart)
            self._to_failed(f"cannot start worker: {exc}", None, retryable=getattr(exc, "retryable", False))
            return
        self._link = link
        self.placement = link.placement
        self.pid = link.placement.pid
        self._set(S.STARTING, restart=restart)
        self._timers.append(asyncio.get_running_loop().call_later(
            self._timeouts.load_timeout_s, self._inbox.put, LoadTimeout(link)))

    def _on_exit(self, link: WorkerLink, exit: LinkExit) -> None:
        self._cancel_timers()
        self.exit_code = exit.code
        st = self.state
        if st is S.STOPPING:
            link.fail_requests(WorkerCrashed(
                f"{self.spec.id} was stopped ({self._stop_reason}) before the request finished"))
            self._set(S.STOPPED, reason=self._stop_reason, exit_code=exit.code)
            resolve_all(self._stop_waiters)
            if self._start_after_stop:
                self._start_after_stop = False
                self.request_start()
            return
        if st not in (S.STARTING, S.READY):
            return
        reason = failure_reason(self.spec.id, exit, self._load_error, loading=st is S.STARTING, log_tail=link.log_tail())
        link.fail_requests(WorkerCrashed(f"the worker serving {self.spec.id} failed: {exit.reason}"))
        self._to_failed(reason, exit.code, retryable=self._load_error is None)

    def _to_failed(self, reason: str, code: int | None, *, retryable: bool) -> None:
        decision = self._policy.on_failure(retryable=retryable)
        self.reason = reason
        self.final = decision.final
        self.restart_pending = decision.restart
        self._set(S.FAILED, reason=reason, exit_code=code, restart=decision.restart)
        if decision.restart:
            self._timers.append(asyncio.get_running_loop().call_later(
                decision.delay_s, self._inbox.put, RestartDue()))
        else:
            fail_all(self._start_waiters, LoadFailed(f"{self.spec.id} failed to load: {reason}"))

    def _discard(self) -> None:
        self._cancel_timers()
        self.restart_pending = False
        for task in self._tasks:
            task.cancel()
        link = self._link
        if link is not None and link.exit is None:
            link.kill()
            link.fail_requests(WorkerCrashed(f"{self.spec.id} instance replaced"))
        gone = Unavailable(f"{self.spec.id} was unloaded", retry_after_s=1)
        fail_all(self._start_waiters, gone)
        self._start_after_stop = False
        resolve_all(self._stop_waiters)
        self._inbox.close(gone)  # commands nobody will run

    # ----------------------------------------------------------------- helpers

    def _set(self, new: InstanceState, *, reason: str | None = None,
             exit_code: int | None = None, restart: bool = False) -> None:
        old = self.state
        if new not in ALLOWED[old]:
            raise RuntimeError(f"{self.name}: illegal transition {old.value} -> {new.value}")
        self.state = new
        self._bus.publish(EventName.STATUS_CHANGE, self.spec.id,
                          **status_fields(self.index, old, new, self.pid, self.placement, reason, exit_code))
        self._on_change(self, Transition(old, new, restart))

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
