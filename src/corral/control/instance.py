"""One worker process for one model instance, and the one task that owns its state.

States (``InstanceState``) and what each command does in them:

    state      start                    stop                      process exits
    stopped    spawn -> starting        nothing                   -
    starting   wait for Ready           Shutdown -> stopping      -> failed (+restart?)
    ready      nothing                  Shutdown -> stopping      -> failed (+restart?)
    stopping   start again once stopped wait                      -> stopped
    failed     spawn -> starting        -> stopped                -

Only the owner task (``_own``) changes ``state``: callers put commands in its inbox,
the socket reader and the process waiter put what they saw there too (tagged with
the spawn generation, so news from an old process is ignored). Every transition is
checked against ``_ALLOWED`` and published as ``status_change`` (old, new, reason,
exit_code, pid) on the event bus.

The hot path does not go through the owner: ``submit`` writes a frame to the socket
and the protocol hands Delta/Finished straight to the request's ``RequestStream``.
Slot accounting (``busy``) belongs to the model's pool; the instance only zeroes it
when it leaves ``ready`` (its requests are failed then).

Stop = Shutdown message; after ``stop_grace_s`` SIGTERM to the process group; after
2 more seconds SIGKILL to the group. A crash (socket EOF or exit while starting or
ready) fails in-flight requests with ``WorkerCrashed`` and restarts with backoff
(1 s, 2 s, 4 s ... max 30 s) up to ``max_restarts`` consecutive failures; a load
that the worker itself reports as failed (LoadFailed) or a load timeout is final.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral import wire
from corral.control.events import EventBus
from corral.control.process import Launcher, describe_exit, kill_group, log_tail
from corral.control.stream import RequestStream
from corral.errors import LoadFailed, Unavailable, WorkerCrashed

__all__ = ["InstanceState", "Instance"]

log = logging.getLogger("corral.instance")

_KILL_AFTER_TERM_S = 2.0
_EXIT_AFTER_EOF_S = 1.0  # a worker whose socket closed must exit within this, or is killed
_STABLE_S = 30.0  # ready this long: the consecutive-failure count starts over
_MAX_BACKOFF_S = 30.0


class InstanceState(str, enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


S = InstanceState
_ALLOWED: dict[InstanceState, set[InstanceState]] = {
    S.STOPPED: {S.STARTING},
    S.STARTING: {S.READY, S.STOPPING, S.FAILED},
    S.READY: {S.STOPPING, S.FAILED},
    S.STOPPING: {S.STOPPED},
    S.FAILED: {S.STARTING, S.STOPPED},
}


# inbox items --------------------------------------------------------------------------
@dataclass(slots=True)
class _Start:
    reply: asyncio.Future[None]
    reset: bool


@dataclass(slots=True)
class _Stop:
    reply: asyncio.Future[None]
    reason: str


@dataclass(slots=True)
class _Msg:
    gen: int
    msg: Any


@dataclass(slots=True)
class _Eof:
    gen: int


@dataclass(slots=True)
class _Exited:
    gen: int
    rc: int | None


@dataclass(slots=True)
class _LoadTimeout:
    gen: int


@dataclass(slots=True)
class _RestartDue:
    gen: int


class _Protocol(asyncio.Protocol):
    """Frames from the worker socket. Request traffic is dispatched inline."""

    def __init__(self, inst: "Instance", gen: int) -> None:
        self._inst = inst
        self._gen = gen
        self._dec = wire.FrameDecoder()

    def data_received(self, data: bytes) -> None:
        inst = self._inst
        try:
            bodies = self._dec.feed(data)
            for body in bodies:
                inst._on_message(self._gen, wire.decode_from_worker(body))
        except Exception:  # a malformed frame: the worker is broken
            log.exception("%s: bad frame from worker; killing it", inst.name)
            kill_group(inst.pid, signal.SIGKILL)

    def connection_lost(self, exc: Exception | None) -> None:
        self._inst._inbox.put_nowait(_Eof(self._gen))


class Instance:
    def __init__(self, spec: Any, index: int, *, launcher: Launcher, bus: EventBus,
                 threads: int | None, on_change: Callable[["Instance"], None],
                 on_slot_free: Callable[["Instance"], None]) -> None:
        self.spec = spec
        self.index = index
        self.name = f"{spec.id}#{index}"
        self._launcher = launcher
        self._bus = bus
        self.threads = threads
        self._on_change = on_change
        self._on_slot_free = on_slot_free

        self.state = InstanceState.STOPPED
        self.pid: int | None = None
        self.reason: str | None = None
        self.exit_code: int | None = None
        self.info: wire.ModelInfo | None = None
        self.stats: wire.Stats | None = None
        self.log_path: Path | None = None
        self.restarts = 0  # restarts after crashes, lifetime
        self.failures = 0  # consecutive failures
        self.final = False  # failed and no restart will follow
        self.restart_pending = False
        self.start_requested = False  # a start command is in the inbox
        self.last_used = 0.0
        self.ready_at: float | None = None
        self.load_started: float | None = None
        self.last_load_s: float | None = None

        # slot accounting, owned by the pool
        self.busy = 0
        self.recent: deque[str] = deque(maxlen=max(2, 2 * spec.n_parallel))

        self._requests: dict[str, RequestStream] = {}
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._gen = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._transport: asyncio.Transport | None = None
        self._load_error: str | None = None
        self._start_waiters: list[asyncio.Future[None]] = []
        self._stop_waiters: list[asyncio.Future[None]] = []
        self._start_after_stop = False
        self._stop_reason: str | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stats_waiters: list[asyncio.Future[wire.Stats]] = []
        self._owner = asyncio.get_running_loop().create_task(self._own(), name=f"instance {self.name}")

    # ----------------------------------------------------------------- public API

    @property
    def slots_total(self) -> int:
        return self.info.n_slots if self.info is not None else self.spec.n_parallel

    @property
    def free_slots(self) -> int:
        t = self._transport
        if self.state is not InstanceState.READY or t is None or t.is_closing():
            return 0  # a worker whose socket is closing gets nothing new
        return self.slots_total - self.busy

    @property
    def memory_bytes(self) -> int | None:
        """What the worker reported: weights + KV cache (latest Stats, else Ready)."""
        if self.stats is not None:
            return self.stats.model_bytes + self.stats.kv_bytes
        if self.info is not None:
            return self.info.model_bytes + self.info.kv_bytes
        return None

    @property
    def rss_bytes(self) -> int | None:
        if self.stats is not None:
            return self.stats.rss_bytes
        return self.info.rss_bytes if self.info is not None else None

    async def start(self, *, reset: bool = False) -> None:
        """Until ready. Raises ``LoadFailed`` when the load fails for good.
        ``reset`` forgets earlier failures (an explicit load)."""
        fut = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(_Start(fut, reset))
        await fut

    def request_start(self, *, reset: bool = False) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume)
        self.start_requested = True
        self._inbox.put_nowait(_Start(fut, reset))
        return fut

    async def stop(self, reason: str = "stopped") -> None:
        fut = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait(_Stop(fut, reason))
        await fut

    async def close(self) -> None:
        """Stop and end the owner task."""
        await self.stop("router shutting down")
        self._owner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._owner

    def discard(self) -> None:
        """Forget this instance (a fresh one replaces it): end its owner task; a process
        still running (never expected) is killed."""
        self._cancel_timers()
        self.restart_pending = False
        if self.state in (S.STARTING, S.READY, S.STOPPING):
            kill_group(self.pid, signal.SIGKILL)
        self._fail_requests(WorkerCrashed(f"{self.spec.id} instance replaced"))
        self._owner.cancel()
        for task in list(self._tasks):
            if not task.get_coro().__name__ == "_wait_exit":  # let the reaper finish
                task.cancel()

    def submit(self, msg: wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest,
               stream: RequestStream) -> bool:
        """Send a request (sync). False when the instance cannot take it now."""
        t = self._transport
        if self.state is not InstanceState.READY or t is None or t.is_closing():
            return False
        self._requests[msg.id] = stream
        stream.instance = self
        stream.started = time.perf_counter()
        t.write(wire.encode(msg))
        return True

    def abort(self, request_id: str) -> None:
        t = self._transport
        if request_id in self._requests and t is not None and not t.is_closing():
            t.write(wire.encode(wire.Abort(request_id)))

    async def fetch_stats(self, timeout_s: float = 2.0) -> wire.Stats | None:
        t = self._transport
        if self.state is not InstanceState.READY or t is None or t.is_closing():
            return None
        fut: asyncio.Future[wire.Stats] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(fut)
        t.write(wire.encode(wire.StatsRequest()))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except (asyncio.TimeoutError, WorkerCrashed):
            return None
        finally:
            if fut in self._stats_waiters:
                self._stats_waiters.remove(fut)

    @property
    def inflight(self) -> int:
        return len(self._requests)

    # ----------------------------------------------------------------- hot path (sync)

    def _on_message(self, gen: int, msg: Any) -> None:
        t = type(msg)
        if t is wire.Delta:
            r = self._requests.get(msg.id)
            if r is not None:
                r.on_delta(msg)
        elif t is wire.Finished or t is wire.RequestFailed or t is wire.Embeddings or t is wire.Tokenized:
            r = self._requests.pop(msg.id, None)
            if r is not None:
                r.on_end(msg)
                if gen == self._gen:
                    self._on_slot_free(self)
        elif t is wire.Stats:
            self.stats = msg
            waiters, self._stats_waiters = self._stats_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(msg)
        else:
            self._inbox.put_nowait(_Msg(gen, msg))

    # ----------------------------------------------------------------- the owner

    async def _own(self) -> None:
        while True:
            item = await self._inbox.get()
            try:
                await self._handle(item)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: error handling %r", self.name, item)

    async def _handle(self, item: Any) -> None:
        st = self.state
        if isinstance(item, _Start):
            try:
                if item.reset:
                    self.failures = 0
                if st is S.READY:
                    _resolve(item.reply)
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
            finally:
                self.start_requested = False
        elif isinstance(item, _Stop):
            if st is S.STOPPED:
                _resolve(item.reply)
            elif st is S.FAILED:
                self._cancel_timers()
                self.restart_pending = False
                self._set(S.STOPPED, reason=item.reason)
                self._fail_start_waiters(Unavailable(f"{self.spec.id} was stopped: {item.reason}"))
                _resolve(item.reply)
            elif st is S.STOPPING:
                self._start_after_stop = False
                self._stop_waiters.append(item.reply)
            else:  # starting or ready: ask, then insist
                self._stop_waiters.append(item.reply)
                self._stop_reason = item.reason
                self._set(S.STOPPING, reason=item.reason)
                self._fail_start_waiters(Unavailable(f"{self.spec.id} was stopped while loading: {item.reason}"))
                t = self._transport
                if t is not None and not t.is_closing():
                    t.write(wire.encode(wire.Shutdown()))
                self._spawn_task(self._escalate(self._gen, self.pid))
        elif item.gen != self._gen:
            return  # news from an earlier process
        elif isinstance(item, _Msg):
            self._on_control_message(item.msg)
        elif isinstance(item, _Eof):
            self._transport = None
            if st in (S.STARTING, S.READY, S.STOPPING):
                # the process should be exiting; make sure of it
                self._timers.append(asyncio.get_running_loop().call_later(
                    _EXIT_AFTER_EOF_S, kill_group, self.pid, signal.SIGKILL))
        elif isinstance(item, _Exited):
            self._on_exit(item.rc)
        elif isinstance(item, _LoadTimeout):
            if st is S.STARTING:
                self._load_error = (f"load did not finish within load_timeout_s="
                                    f"{self._launcher.load_timeout_s:g}")
                kill_group(self.pid, signal.SIGKILL)
        elif isinstance(item, _RestartDue):
            if st is S.FAILED and self.restart_pending:
                self.restart_pending = False
                self.restarts += 1
                await self._spawn()

    def _on_control_message(self, msg: Any) -> None:
        if isinstance(msg, wire.Loading):
            self.pid = msg.pid
        elif isinstance(msg, wire.Ready):
            if self.state is not S.STARTING:
                return
            self.info = msg.info
            self.stats = None
            self.busy = 0
            self.ready_at = time.monotonic()
            self.last_load_s = time.monotonic() - (self.load_started or self.ready_at)
            self.last_used = time.time()
            self._cancel_timers()
            self._set(S.READY)
            waiters, self._start_waiters = self._start_waiters, []
            for w in waiters:
                _resolve(w)
        elif isinstance(msg, wire.LoadFailed):
            self._load_error = msg.reason

    async def _spawn(self) -> None:
        self._gen += 1
        gen = self._gen
        self._load_error = None
        self.info = None
        self.stats = None
        self.exit_code = None
        self.reason = None
        self.final = False
        self.load_started = time.monotonic()
        settings = self.spec.worker_settings(self.index, self.threads)
        try:
            proc, sock, self.log_path = await self._launcher.spawn(settings)
        except OSError as exc:
            self._set(S.STARTING)
            self._to_failed(f"cannot start worker: {exc}", None, restart=False)
            return
        self._proc = proc
        self.pid = proc.pid
        self._set(S.STARTING)
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.connect_accepted_socket(lambda: _Protocol(self, gen), sock)
            self._transport = transport  # type: ignore[assignment]
        except OSError as exc:
            sock.close()
            self._load_error = f"cannot talk to worker: {exc}"
            kill_group(proc.pid, signal.SIGKILL)
        self._spawn_task(self._wait_exit(gen, proc))
        self._timers.append(loop.call_later(self._launcher.load_timeout_s,
                                            self._inbox.put_nowait, _LoadTimeout(gen)))

    async def _wait_exit(self, gen: int, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        self._inbox.put_nowait(_Exited(gen, rc))

    async def _escalate(self, gen: int, pid: int | None) -> None:
        """Shutdown was sent. Grace, then SIGTERM the group, then SIGKILL it."""
        await asyncio.sleep(self._launcher.stop_grace_s)
        if gen != self._gen or self.state is not S.STOPPING:
            return
        log.warning("%s: no exit %.1fs after Shutdown; SIGTERM", self.name, self._launcher.stop_grace_s)
        kill_group(pid, signal.SIGTERM)
        await asyncio.sleep(_KILL_AFTER_TERM_S)
        if gen != self._gen or self.state is not S.STOPPING:
            return
        log.warning("%s: still running after SIGTERM; SIGKILL", self.name)
        kill_group(pid, signal.SIGKILL)

    def _on_exit(self, rc: int | None) -> None:
        self._cancel_timers()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        # whatever else the worker group left behind goes too
        kill_group(self.pid, signal.SIGKILL)
        self.exit_code = rc
        st = self.state
        if st is S.STOPPING:
            self._fail_requests(WorkerCrashed(
                f"{self.spec.id} was stopped ({self._stop_reason}) before the request finished"))
            self._set(S.STOPPED, reason=self._stop_reason, exit_code=rc)
            waiters, self._stop_waiters = self._stop_waiters, []
            for w in waiters:
                _resolve(w)
            if self._start_after_stop:
                self._start_after_stop = False
                self.start_requested = True
                self._inbox.put_nowait(_Start(_done_future(), False))
            return
        if st not in (S.STARTING, S.READY):
            return
        tail = log_tail(self.log_path)
        if self._load_error is not None:
            reason = self._load_error
            restart = False
        else:
            reason = describe_exit(rc)
            if st is S.STARTING:
                reason = f"worker died while loading: {reason}"
            restart = True
        tail = "\n".join(ln for ln in tail.splitlines() if reason not in ln)  # no echo of the reason
        if tail:
            reason += f"; last log lines:\n{tail}"
        self._fail_requests(WorkerCrashed(f"the worker serving {self.spec.id} failed: {describe_exit(rc)}"))
        self._to_failed(reason, rc, restart=restart)

    def _to_failed(self, reason: str, rc: int | None, *, restart: bool) -> None:
        now = time.monotonic()
        if self.ready_at is not None and now - self.ready_at > _STABLE_S:
            self.failures = 0
        self.ready_at = None
        self.failures += 1
        self.reason = reason
        self.busy = 0
        restart = restart and self.failures <= self._launcher.max_restarts
        self.final = not restart
        self.restart_pending = restart
        self._set(S.FAILED, reason=reason, exit_code=rc)
        if restart:
            delay = min(_MAX_BACKOFF_S, self._launcher.restart_backoff_s * 2 ** (self.failures - 1))
            self._timers.append(asyncio.get_running_loop().call_later(
                delay, self._inbox.put_nowait, _RestartDue(self._gen)))
        else:
            self._fail_start_waiters(LoadFailed(f"{self.spec.id} failed to load: {reason}"))

    # ----------------------------------------------------------------- helpers

    def _set(self, new: InstanceState, *, reason: str | None = None,
             exit_code: int | None = None) -> None:
        old = self.state
        if new not in _ALLOWED[old]:
            raise RuntimeError(f"{self.name}: illegal transition {old.value} -> {new.value}")
        self.state = new
        if new is not S.READY:
            self.busy = 0
        fields: dict[str, Any] = {"instance": self.index, "old": old.value, "new": new.value,
                                  "pid": self.pid}
        if reason is not None:
            fields["reason"] = reason
        if exit_code is not None:
            fields["exit_code"] = exit_code
        self._bus.publish("status_change", self.spec.id, **fields)
        self._on_change(self)

    def _fail_requests(self, exc: Exception) -> None:
        reqs, self._requests = self._requests, {}
        for r in reqs.values():
            r.fail(exc)  # type: ignore[arg-type]
        waiters, self._stats_waiters = self._stats_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(WorkerCrashed("worker gone"))
                w.exception()

    def _fail_start_waiters(self, exc: Exception) -> None:
        waiters, self._start_waiters = self._start_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(exc)

    def _cancel_timers(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _consume(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # mark retrieved: the pool reads outcomes from state


def _done_future() -> asyncio.Future[None]:
    fut = asyncio.get_running_loop().create_future()
    fut.add_done_callback(_consume)
    return fut
