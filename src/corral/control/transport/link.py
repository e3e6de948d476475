"""The link to one spawned worker: how the router reaches a worker, wherever it runs.

A ``Spawner`` starts a worker (``python -m corral.worker`` with some ``WorkerSettings``)
and returns a ``WorkerLink``, one per spawn. Above the link nothing is transport
specific: the instance (``corral.control.instance.instance``) drives its state machine from
what the link reports, and requests go through ``submit``/``abort``.

A link

- carries frames both ways: ``send`` writes a ``wire.ToWorker`` message; every
  decoded ``wire.FromWorker`` message is handled here (``deliver``): request traffic
  (Delta, Finished, RequestFailed, Embeddings) goes straight to the request's
  ``RequestStream`` and Stats to whoever asked (the hot path: synchronous, no task or
  queue per token); lifecycle messages (Loading, Ready, LoadFailed) go to the owner.
  A frame that cannot be decoded kills the worker; an error in the router's own
  handling of a message (the stream, the slot release) fails only the request it
  was for, with ``InternalError``, and is logged as a router error;
- can be stopped (``send(wire.Shutdown())``), terminated (SIGTERM-like) and killed
  (SIGKILL-like; the whole process group for a local worker);
- reports that its channel closed (``LinkOwner.link_closed``; no message follows) and
  then that the worker exited (``LinkOwner.link_exited`` with a ``LinkExit``: the exit
  code and the reason in words); after ``link_exited`` the link is finished;
- reports where it runs (``placement``: pid, node id, node address; node id and address
  are None for this machine), and the last lines of the worker's log (``log_tail``).

A transport implements a ``Spawner`` and a ``WorkerLink`` subclass that sets
``_transport`` (the asyncio transport frames go out on; ``_write`` and ``is_open`` use
it) and has ``terminate``, ``kill``, ``placement`` (and optionally ``log_tail``), and
feeds what it receives to ``receive(bytes)`` (raw frames) or ``deliver(msg)``, then
calls ``closed()`` and ``exited(LinkExit)``. ``LocalSpawner``/``SocketLink`` (below) are
the local transport: a child process of the router on a ``socketpair``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


from corral import wire
from corral.control.stream import RequestStream
from corral.errors import InternalError, WorkerCrashed

__all__ = ["Placement", "LinkExit", "LinkOwner", "WorkerLink", "Spawner", "LinkClosed",
           "LifecycleMessage", "FrameReader"]

log = logging.getLogger("corral.link")

LifecycleMessage = wire.Loading | wire.Ready | wire.LoadFailed


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a worker runs. ``node_id``/``node_address`` None: on this machine."""

    pid: int | None = None
    node_id: str | None = None
    node_address: str | None = None

    @property
    def local(self) -> bool:
        return self.node_id is None


@dataclass(frozen=True, slots=True)
class LinkExit:
    """How a worker ended: ``code`` as a subprocess reports it (negative: killed by
    that signal; None: unknown) and ``reason``, the same in words for a person."""

    code: int | None
    reason: str


class LinkClosed(Exception):
    """``send`` on a link whose channel is closed."""


class LinkOwner(Protocol):
    """What a link reports to (the instance). All calls come from the event loop."""

    def link_message(self, link: "WorkerLink", msg: LifecycleMessage) -> None: ...

    def link_request_ended(self, link: "WorkerLink") -> None: ...

    def link_closed(self, link: "WorkerLink") -> None: ...

    def link_exited(self, link: "WorkerLink", exit: LinkExit) -> None: ...


class Spawner(Protocol):
    """Starts workers. ``spawn`` returns once the worker process exists (not when it is
    loaded: Loading/Ready/LoadFailed arrive through the owner). Raises ``OSError``
    (or a subclass) when it cannot start one."""

    async def spawn(self, settings: wire.WorkerSettings, owner: LinkOwner) -> "WorkerLink": ...


class WorkerLink(abc.ABC):
    """One spawned worker. The transport-independent part: request routing, stats,
    frame decoding. Subclasses provide the channel and the process."""

    def __init__(self, owner: LinkOwner, log_path: Path | None = None) -> None:
        self._owner = owner
        self.log_path = log_path
        self.stats: wire.Stats | None = None
        self._requests: dict[str, RequestStream] = {}
        self._stopping: set[str] = set()  # failed by a router error, still running on the worker
        self._unslotted: set[str] = set()  # running requests that hold no slot (tokenizing)
        self._stats_waiters: list[asyncio.Future[wire.Stats]] = []
        self._slot_files: dict[str, asyncio.Future[wire.SlotFileDone]] = {}  # POST /slots/{id} by action id
        self._decoder = wire.FrameDecoder()
        self._exit: LinkExit | None = None
        self._transport: asyncio.WriteTransport | None = None  # set by the subclass once connected
        self._held: list[bytes] = []  # requests' frames of this loop turn, for one write (``submit``)

    # ------------------------------------------------------------ transport (subclasses)

    @property
    @abc.abstractmethod
    def placement(self) -> Placement: ...

    @property
    def is_open(self) -> bool:
        """The channel can carry frames to the worker."""
        t = self._transport
        return t is not None and not t.is_closing()

    def _write(self, frame: bytes) -> None:
        """Queue one encoded frame to the worker (never blocks), after any held ones."""
        if self._held:
            self._held.append(frame)
            self._flush()
        elif self._transport is not None:
            self._transport.write(frame)

    def _write_soon(self, frame: bytes) -> None:
        """Hold a request's frame until the end of this turn of the event loop, then write
        it with every other held one (``submit``). Requests that arrive together (a burst of
        clients, read in one poll) then reach the worker in one write: it wakes once and
        starts them in the same step, where a write each woke it for the first and left
        the rest to its next step; and on shared cores each write was a chance for the
        woken worker to take the router's core. Any other frame goes out after the held
        ones (``_write``), so the order to the worker stays the order of the calls."""
        if not self._held:
            asyncio.get_running_loop().call_soon(self._flush)
        self._held.append(frame)

    def _flush(self) -> None:
        held, self._held = self._held, []
        t = self._transport
        if held and t is not None and not t.is_closing():  # closed since: the requests fail with the link
            t.write(held[0] if len(held) == 1 else b"".join(held))

    @abc.abstractmethod
    def terminate(self) -> None:
        """Ask the system to end the worker (SIGTERM to a local process group)."""

    @abc.abstractmethod
    def kill(self) -> None:
        """End the worker now (SIGKILL to a local process group). Harmless when gone."""

    def log_tail(self) -> str:
        """The last lines of the worker's log, for failure reasons ("" if unknown)."""
        return ""

    # ------------------------------------------------------------ what the transport calls

    def receive(self, data: bytes) -> None:
        """Raw bytes from the worker's channel: frames are split, decoded, delivered.
        A malformed frame means a broken worker: it is killed. An error in what the
        router does with a well-formed message is the router's: it is logged as such and
        fails at most the one request the message was for (``deliver``); the worker and
        its other requests carry on.

        First tokens first: the Deltas that start a request are delivered before the other
        messages of the same read (each request's own messages keep their order). A step
        frame carries one token for every running request, the newest last; delivered in
        that order, a request's first token waited behind every other request's next one
        (at 64 running requests, several milliseconds of the router's time): a new token
        for a request that already has text can wait that long unnoticed, a first one is
        the client's time to first token. The request handlers run in the order they
        are woken, which is the order of delivery."""
        msgs: list[wire.FromWorker] = []
        try:
            for body in self._decoder.feed(data):
                msgs.append(wire.decode_from_worker(body))
        except Exception:
            self._deliver_all(msgs)  # what came before the bad frame
            log.exception("bad frame from worker %s; killing it", self.placement)
            self.kill()
            return
        if len(msgs) > 1:
            msgs = self._first_tokens_first(msgs)
        self._deliver_all(msgs)

    def _first_tokens_first(self, msgs: list[wire.FromWorker]) -> list[wire.FromWorker]:
        """``msgs`` with the Deltas that start a request moved to the front (``receive``);
        a Delta moves only if no earlier message of the batch was for its request."""
        first: list[wire.FromWorker] = []
        rest: list[wire.FromWorker] = []
        seen: set[str] = set()
        requests = self._requests
        for msg in msgs:
            rid: str | None = getattr(msg, "id", None)
            if type(msg) is wire.Delta and msg.id not in seen:
                r = requests.get(msg.id)
                if r is not None and r.first_token is None:
                    first.append(msg)
                    seen.add(msg.id)
                    continue
            if rid is not None:
                seen.add(rid)
            rest.append(msg)
        return first + rest if first else msgs

    def _deliver_all(self, msgs: list[wire.FromWorker]) -> None:
        for msg in msgs:
            try:
                self.deliver(msg)
            except Exception:
                log.exception("router error handling %s from worker %s (the worker is not at fault)",
                              type(msg).__name__, self.placement)

    def deliver(self, msg: wire.FromWorker) -> None:
        """One message from the worker. Request traffic is handled inline; an error in the
        router's handling of it fails that request (``_router_failed``)."""
        if type(msg) is wire.Delta:
            r = self._requests.get(msg.id)
            if r is not None:
                try:
                    r.on_delta(msg)
                except Exception as exc:  # noqa: BLE001 - a router error fails this request only (logged)
                    del self._requests[msg.id]
                    self._stopping.add(msg.id)  # the worker stops it (Abort); its end frees the slot
                    self._router_failed(msg.id, r, exc)
                    if self.is_open:
                        self._write(wire.encode(wire.Abort(msg.id)))
        elif (type(msg) is wire.Finished or type(msg) is wire.RequestFailed
              or type(msg) is wire.Embeddings or type(msg) is wire.Tokenized):
            r = self._requests.pop(msg.id, None)
            if r is not None:
                try:
                    r.on_end(msg)
                except Exception as exc:  # noqa: BLE001 - a router error fails this request only (logged)
                    self._router_failed(msg.id, r, exc)
                finally:
                    if msg.id in self._unslotted:
                        self._unslotted.discard(msg.id)
                    else:
                        self._owner.link_request_ended(self)
            elif msg.id in self._stopping:
                self._stopping.discard(msg.id)
                self._owner.link_request_ended(self)
        elif type(msg) is wire.Paused:  # a preempted request (corral.control.scheduling.preempt)
            r = self._requests.get(msg.id)
            if r is not None and r.on_pause is not None:
                r.on_pause(msg)
        elif isinstance(msg, wire.Stats):
            self.stats = msg
            waiters, self._stats_waiters = self._stats_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(msg)
        elif isinstance(msg, wire.SlotFileDone):
            fut = self._slot_files.pop(msg.id, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, (wire.Loading, wire.Ready, wire.LoadFailed)):
            self._owner.link_message(self, msg)

    def _router_failed(self, request_id: str, stream: RequestStream, exc: Exception) -> None:
        """The router's own code failed on a message for ``stream``: that request ends
        with an internal error (500), logged with its traceback."""
        log.error("router error on request %s (worker %s is not at fault); failing the request",
                  request_id, self.placement, exc_info=exc)
        stream.fail(InternalError("the router failed on this request (a router error; see the server log)"))

    def closed(self) -> None:
        """The channel closed: nothing more will be received."""
        self._owner.link_closed(self)

    def exited(self, exit: LinkExit) -> None:
        """The worker is gone. Reported once; the link is finished afterwards."""
        if self._exit is None:
            self._exit = exit
            self._owner.link_exited(self, exit)

    # ------------------------------------------------------------ what the router calls

    @property
    def exit(self) -> LinkExit | None:
        return self._exit

    def send(self, msg: wire.ToWorker) -> None:
        """Encode and write one message. Raises ``LinkClosed`` when the channel is closed
        (and ``wire.FrameTooLarge`` / ``OverflowError`` for what cannot be encoded)."""
        frame = wire.encode(msg)
        if not self.is_open:
            raise LinkClosed("the worker's channel is closed")
        self._write(frame)

    async def shutdown(self, grace_s: float, kill_after_s: float = 2.0) -> None:
        """Ask the worker to exit (``Shutdown``); still there after ``grace_s``:
        terminate it; ``kill_after_s`` later: kill it."""
        with contextlib.suppress(LinkClosed, OSError):
            # the prompt cache's most valuable prefixes to disk first (wire/cache.py), in
            # part of the grace: the write never holds a swap up for longer
            self.send(wire.PersistCache(timeout_s=grace_s * 0.6))
            self.send(wire.Shutdown())
        await asyncio.sleep(grace_s)
        if self._exit is not None:
            return
        log.warning("worker %s: no exit %.1fs after Shutdown; terminating it", self.placement, grace_s)
        self.terminate()
        await asyncio.sleep(kill_after_s)
        if self._exit is None:
            log.warning("worker %s: still running; killing it", self.placement)
            self.kill()

    def submit(self, request_id: str, frame: bytes, stream: RequestStream, instance_index: int,
               slotted: bool = True) -> bool:
        """Send an encoded request (sync; written at the end of this loop turn, with the
        others of the turn: ``_write_soon``). False when the channel is closed. ``slotted=False``:
        a request that holds no slot (tokenizing), so its end frees none."""
        if not self.is_open:
            return False
        if not slotted:
            self._unslotted.add(request_id)
        self._requests[request_id] = stream
        stream.bind(instance_index, self.abort)
        stream.send = self._send_for
        stream.started = time.perf_counter()
        self._write_soon(frame)
        return True

    def _send_for(self, msg: wire.Preempt | wire.Resume) -> bool:
        """A preemption frame for a request running here; False when it is gone or the channel closed."""
        if msg.id not in self._requests or not self.is_open:
            return False
        self._write(wire.encode(msg))
        return True

    def abort(self, request_id: str) -> None:
        if request_id in self._requests and self.is_open:
            self._write(wire.encode(wire.Abort(request_id)))

    async def fetch_stats(self, timeout_s: float = 2.0) -> wire.Stats | None:
        if not self.is_open:
            return None
        fut: asyncio.Future[wire.Stats] = asyncio.get_running_loop().create_future()
        self._stats_waiters.append(fut)
        self._write(wire.encode(wire.StatsRequest()))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except (asyncio.TimeoutError, WorkerCrashed):
            return None
        finally:
            if fut in self._stats_waiters:
                self._stats_waiters.remove(fut)

    async def slot_file(self, msg: wire.SlotFileAction) -> wire.SlotFileDone:
        """Send a slot file action and wait for its answer (the worker defers it while the
        slot is busy). Raises ``LinkClosed``, or ``WorkerCrashed`` when the worker goes."""
        fut: asyncio.Future[wire.SlotFileDone] = asyncio.get_running_loop().create_future()
        self.send(msg)
        self._slot_files[msg.id] = fut
        try:
            return await fut
        finally:
            self._slot_files.pop(msg.id, None)

    @property
    def inflight(self) -> int:
        return len(self._requests) + len(self._stopping)

    def fail_requests(self, exc: WorkerCrashed) -> None:
        """End every request still running on this worker with ``exc``."""
        reqs, self._requests = self._requests, {}
        self._stopping.clear()
        self._unslotted.clear()
        for r in reqs.values():
            r.fail(exc)
        waiters, self._stats_waiters = self._stats_waiters, []
        for w in waiters:
            if not w.done():
                w.set_exception(WorkerCrashed("worker gone"))
                w.exception()
        files, self._slot_files = self._slot_files, {}
        for f in files.values():
            if not f.done():
                f.set_exception(WorkerCrashed("the worker exited before the slot action ended"))


class FrameReader(asyncio.Protocol):
    """The router's end of a worker's connection (a socketpair or TCP): bytes go to
    ``receive``, the end of the connection to ``lost``."""

    def __init__(self, receive: Callable[[bytes], None], lost: Callable[[], None]) -> None:
        self._receive = receive
        self._lost = lost

    def data_received(self, data: bytes) -> None:
        self._receive(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()
