"""The one task that owns an instance's state (``Owner._own``): what each inbox item does
in each state (the table in instance.py's docstring), the spawn, a worker's news (Loading,
Ready, a load failure, its channel closing, its exit) and the transitions, each checked
against ``ALLOWED``, published as ``status_change`` and passed to ``on_change``. A crash
fails in-flight requests with ``WorkerCrashed``; the ``RestartPolicy`` decides whether and
when it restarts. ``Instance`` (instance.py) is this plus its commands and views: only this
part writes the state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from corral import wire
from corral.control.catalog import ModelSpec
from corral.control.instance.inbox import (KEPT, Closed, Discard, Exited, Inbox, Kept, Lifecycle, LoadTimeout,
                                           RestartDue, Start, Stop, fail_all, resolve, resolve_all)
from corral.control.instance.restart import RestartPolicy
from corral.control.instance.state import ALLOWED, InstanceState, Timeouts, Transition, failure_reason, status_fields
from corral.control.placement.gpu_slot import GpuSlot
from corral.control.transport.link import LifecycleMessage, LinkExit, LinkOwner, Placement, Spawner, WorkerLink
from corral.errors import LoadFailed, Unavailable, WorkerCrashed
from corral.events import EventBus, EventName

__all__ = ["Owner"]

log = logging.getLogger("corral.instance")

S = InstanceState
_EXIT_AFTER_EOF_S = 1.0  # a worker whose channel closed must exit within this, or is killed


class Owner:
    # set by Instance.__init__; the public ones are read by the pool and the views
    spec: ModelSpec
    index: int
    name: str
    threads: int | None
    state: InstanceState
    pid: int | None
    placement: Placement
    reason: str | None
    exit_code: int | None
    info: wire.ModelInfo | None
    restarts: int
    final: bool
    restart_pending: bool
    last_load_s: float | None
    _spawner: Spawner
    _timeouts: Timeouts
    _policy: RestartPolicy
    _bus: EventBus
    _gpu: GpuSlot | None
    _link: WorkerLink | None
    _inbox: Inbox
    _load_started: float
    _load_error: str | None
    _start_waiters: list[asyncio.Future[None]]
    _stop_waiters: list[asyncio.Future[None]]
    _start_after_stop: bool
    _stop_reason: str
    _timers: list[asyncio.TimerHandle]
    _tasks: set[asyncio.Task[None]]

    if TYPE_CHECKING:
        def request_start(self, *, reset: bool = False, gpu: GpuSlot | None | Kept = KEPT) -> asyncio.Future[None]: ...
        def _changed(self, t: Transition) -> None: ...  # the Instance tells its pool (on_change)

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
            link = await self._spawner.spawn(settings, cast(LinkOwner, self))  # an Instance: the link's owner
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
        self._changed(Transition(old, new, restart))

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
