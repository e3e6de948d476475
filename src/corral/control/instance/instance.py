"""One model instance and the one task that owns its state.

States (``InstanceState``) and what each command does in them:

    state      start                    stop                      worker exits
    stopped    spawn -> starting        nothing                   -
    starting   wait for Ready           Shutdown -> stopping      -> failed (+restart?)
    ready      nothing                  Shutdown -> stopping      -> failed (+restart?)
    stopping   start again once stopped wait                      -> stopped
    failed     spawn -> starting        -> stopped                -

Only the owner task (``_own``, owner.py) changes state; callers and the link of the current spawn
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
from collections.abc import Callable

from corral import wire
from corral.control.catalog import ModelSpec
from corral.control.placement.gpu_slot import GpuSlot
from corral.events import EventBus
from corral.control.instance.state import InstanceState, Timeouts, Transition
from corral.control.instance.inbox import KEPT, Closed, Discard, Exited, Inbox, Kept, Lifecycle, Start, Stop, consume
from corral.control.instance.owner import Owner
from corral.control.transport.link import LifecycleMessage, LinkExit, Placement, Spawner, WorkerLink
from corral.control.instance.restart import RestartPolicy
from corral.control.stream import RequestStream
from corral.errors import Unavailable

__all__ = ["InstanceState", "Instance", "Timeouts", "Transition"]

S = InstanceState


class Instance(Owner):
    """One model instance: its commands and what the pool, admission and the views read of
    it; its owner task (``Owner``, owner.py) does the rest."""

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
        self._on_change: Callable[[Instance, Transition], None] = on_change
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
        return self.info.n_slots if self.info is not None else self.spec.slots_asked() or 1

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

    def _changed(self, t: Transition) -> None:
        """The owner task's transition, told to the pool."""
        self._on_change(self, t)

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
