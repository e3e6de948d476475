"""The one task that owns an instance's state (``Owner._own``): what each inbox item does
in each state (the table in instance.py's docstring), the spawn, a worker's news (Loading,
Ready, a load failure, its channel closing, its exit) and the transitions, each checked
against ``ALLOWED``, published as ``status_change`` and passed to ``on_change``. A crash
fails in-flight requests with ``WorkerCrashed``; the ``RestartPolicy`` decides whether and
when it restarts. ``Instance`` (instance.py) holds one ``Owner`` and puts its commands and
its link's news into the owner's inbox; it reads the state through the owner's attributes and
never writes them: only the owner task does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from corral import wire
from corral.control.catalog import ModelSpec
from corral.control.instance.inbox import (KEPT, Closed, Discard, Exited, Inbox, Lifecycle, LoadTimeout,
                                           RestartDue, Start, Stop, consume, fail_all, resolve, resolve_all)
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
    """An instance's state and the one task that changes it. Its public attributes are read
    by the instance's views (the pool, admission, /models); none is written from outside."""

    def __init__(self, spec: ModelSpec, index: int, name: str, threads: int | None, *, spawner: Spawner,
                 timeouts: Timeouts, policy: RestartPolicy, bus: EventBus, link_owner: LinkOwner,
                 on_change: Callable[[Transition], None]) -> None:
        self.spec = spec
        self.index = index
        self.name = name
        self.threads = threads
        self._spawner = spawner
        self._timeouts = timeouts
        self.policy = policy  # its failures and backoff are read by the instance's views
        self._bus = bus
        self._link_owner = link_owner  # the Instance: what the links this owner spawns report to
        self._on_change = on_change

        self.state = InstanceState.STOPPED
        self.pid: int | None = None
        self.placement = Placement()
        self.gpu: GpuSlot | None = None  # the placement of the latest start carried out
        self.reason: str | None = None
        self.exit_code: int | None = None
        self.info: wire.ModelInfo | None = None
        self.restarts = 0  # restarts performed after crashes, lifetime
        self.final = False  # failed and no restart will follow
        self.restart_pending = False
        self.last_load_s: float | None = None
        self.link: WorkerLink | None = None  # the current spawn's; news from another is ignored
        self.inbox = Inbox()

        self._load_started = 0.0
        self._load_error: str | None = None
        self._start_waiters: list[asyncio.Future[None]] = []
        self._stop_waiters: list[asyncio.Future[None]] = []
        self._start_after_stop = False
        self._stop_reason = "stopped"
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.task = asyncio.get_running_loop().create_task(self._own(), name=f"instance {name}")

    async def _own(self) -> None:
        while True:
            item = await self.inbox.get()
            if isinstance(item, Discard):
                self._discard()
                return
            try:
                await self._handle(item)
            except Exception:
                log.exception("%s: error handling %r", self.name, item)
            finally:
                self.inbox.handled(item)

    async def _handle(self, item: object) -> None:
        st = self.state
        if isinstance(item, Start):
            if item.reset:
                self.policy.reset()
            if item.gpu is not KEPT:
                self.gpu = item.gpu
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
            if item.link is self.link:  # else: news from an earlier worker
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
            if self.link is not None:
                self._spawn_task(self.link.shutdown(self._timeouts.stop_grace_s))

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
            self.policy.on_ready()
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
        settings = self.spec.worker_settings(self.index, self.threads, self.gpu)
        try:
            link = await self._spawner.spawn(settings, self._link_owner)
        except OSError as exc:  # final, unless the spawner says a later try may work (Ray: no room now)
            self._set(S.STARTING, restart=restart)
            self._to_failed(f"cannot start worker: {exc}", None, retryable=getattr(exc, "retryable", False))
            return
        self.link = link
        self.placement = link.placement
        self.pid = link.placement.pid
        self._set(S.STARTING, restart=restart)
        self._timers.append(asyncio.get_running_loop().call_later(
            self._timeouts.load_timeout_s, self.inbox.put, LoadTimeout(link)))

    def _on_exit(self, link: WorkerLink, exit: LinkExit) -> None:
        self._cancel_timers()
        self.exit_code = exit.code
        st = self.state
        if st is S.STOPPING:
            link.fail_requests(WorkerCrashed(
                f"{self.spec.id} was stopped ({self._stop_reason}) before the request finished"))
            self._set(S.STOPPED, reason=self._stop_reason, exit_code=exit.code)
            resolve_all(self._stop_waiters)
            if self._start_after_stop:  # the waiters of that start are in _start_waiters
                self._start_after_stop = False
                self._handle_later(Start(asyncio.get_running_loop().create_future(), False))
            return
        if st not in (S.STARTING, S.READY):
            return
        reason = failure_reason(self.spec.id, exit, self._load_error, loading=st is S.STARTING, log_tail=link.log_tail())
        link.fail_requests(WorkerCrashed(f"the worker serving {self.spec.id} failed: {exit.reason}"))
        self._to_failed(reason, exit.code, retryable=self._load_error is None)

    def _to_failed(self, reason: str, code: int | None, *, retryable: bool) -> None:
        decision = self.policy.on_failure(retryable=retryable)
        self.reason = reason
        self.final = decision.final
        self.restart_pending = decision.restart
        self._set(S.FAILED, reason=reason, exit_code=code, restart=decision.restart)
        if decision.restart:
            self._timers.append(asyncio.get_running_loop().call_later(
                decision.delay_s, self.inbox.put, RestartDue()))
        else:
            fail_all(self._start_waiters, LoadFailed(f"{self.spec.id} failed to load: {reason}"))

    def _discard(self) -> None:
        self._cancel_timers()
        self.restart_pending = False
        for task in self._tasks:
            task.cancel()
        link = self.link
        if link is not None and link.exit is None:
            link.kill()
            link.fail_requests(WorkerCrashed(f"{self.spec.id} instance replaced"))
        gone = Unavailable(f"{self.spec.id} was unloaded", retry_after_s=1)
        fail_all(self._start_waiters, gone)
        self._start_after_stop = False
        resolve_all(self._stop_waiters)
        self.inbox.close(gone)  # commands nobody will run

    # ----------------------------------------------------------------- helpers

    def _set(self, new: InstanceState, *, reason: str | None = None,
             exit_code: int | None = None, restart: bool = False) -> None:
        old = self.state
        if new not in ALLOWED[old]:
            raise RuntimeError(f"{self.name}: illegal transition {old.value} -> {new.value}")
        self.state = new
        self._bus.publish(EventName.STATUS_CHANGE, self.spec.id,
                          **status_fields(self.index, old, new, self.pid, self.placement, reason, exit_code))
        self._on_change(Transition(old, new, restart))

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def _handle_later(self, item: Start) -> None:
        item.reply.add_done_callback(consume)
        self.inbox.put(item)

    def _spawn_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
