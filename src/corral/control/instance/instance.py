"""One model instance and the one task that owns its state.

States (``InstanceState``) and what each command does in them:

    state      start                    stop                      worker exits
    stopped    spawn -> starting        nothing                   -
    starting   wait for Ready           Shutdown -> stopping      -> failed (+restart?)
    ready      nothing                  Shutdown -> stopping      -> failed (+restart?)
    stopping   start again once stopped wait                      -> stopped
    failed     spawn -> starting        -> stopped                -

Only the owner task (``Owner``, owner.py, which the instance holds) changes state; callers and the
link of the current spawn (``corral.control.transport.link``; news from an earlier link is
ignored) put items in its inbox
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
from corral.control.instance.inbox import KEPT, Closed, Discard, Exited, Kept, Lifecycle, Start, Stop, consume
from corral.control.instance.owner import Owner
from corral.control.transport.link import LifecycleMessage, LinkExit, Placement, Spawner, WorkerLink
from corral.control.instance.restart import RestartPolicy
from corral.control.stream import RequestStream
from corral.errors import Unavailable

__all__ = ["InstanceState", "Instance", "Timeouts", "Transition"]

S = InstanceState


class Instance:
    """One model instance: its commands and what the pool, admission and the views read of
    it. Its state belongs to its ``Owner`` (owner.py), which it holds: the attributes below
    read the owner's, and only the owner's task writes them."""

    def __init__(self, spec: ModelSpec, index: int, *, spawner: Spawner, timeouts: Timeouts,
                 policy: RestartPolicy, bus: EventBus, threads: int | None,
                 on_change: Callable[["Instance", Transition], None],
                 on_slot_free: Callable[["Instance"], None]) -> None:
        self.spec = spec
        self.index = index
        self.name = f"{spec.id}#{index}"
        self.threads = threads
        self._on_slot_free = on_slot_free
        self._discarded = False
        self._owner = Owner(spec, index, self.name, threads, spawner=spawner, timeouts=timeouts, policy=policy,
                            bus=bus, link_owner=self, on_change=lambda t: on_change(self, t))

    # ----------------------------------------------------------------- the owner's state, read

    @property
    def state(self) -> InstanceState:
        return self._owner.state

    @property
    def pid(self) -> int | None:
        return self._owner.pid

    @property
    def placement(self) -> Placement:
        return self._owner.placement

    @property
    def reason(self) -> str | None:
        return self._owner.reason

    @property
    def exit_code(self) -> int | None:
        return self._owner.exit_code

    @property
    def info(self) -> wire.ModelInfo | None:
        return self._owner.info

    @property
    def restarts(self) -> int:
        """Restarts performed after crashes, lifetime."""
        return self._owner.restarts

    @property
    def final(self) -> bool:
        """Failed, and no restart will follow."""
        return self._owner.final

    @property
    def restart_pending(self) -> bool:
        return self._owner.restart_pending

    @property
    def last_load_s(self) -> float | None:
        return self._owner.last_load_s

    # ----------------------------------------------------------------- read-only views

    @property
    def holds_memory(self) -> bool:
        """Starting, ready, stopping, or about to start (a restart due, a start in the inbox)."""
        return self.state in (S.STARTING, S.READY, S.STOPPING) or self.restart_pending or self._owner.inbox.start_pending

    @property
    def gpu(self) -> GpuSlot | None:
        """Where admission placed it (GPUs, need): a pending start's placement, else its own."""
        pending = self._owner.inbox.pending_gpu()
        return self._owner.gpu if pending is KEPT else pending

    @property
    def failures(self) -> int:
        return self._owner.policy.failures

    @property
    def retry_due(self) -> bool:
        """Failed for good after a crash loop, and its backoff has passed."""
        return self.state is S.FAILED and self.final and self._owner.policy.retry_due()

    @property
    def slots_total(self) -> int:
        return self.info.n_slots if self.info is not None else self.spec.slots_asked() or 1

    @property
    def accepting(self) -> bool:
        """Ready, and its channel can take a request."""
        link = self._owner.link
        return self.state is S.READY and link is not None and link.is_open

    @property
    def ready_link(self) -> WorkerLink | None:  # its worker's link while READY (slot files: api/llamacpp)
        return self._owner.link if self.state is S.READY else None

    @property
    def stats(self) -> wire.Stats | None:
        link = self._owner.link
        return link.stats if link is not None else None

    @property
    def log_path(self) -> str | None:
        link = self._owner.link
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
        self._owner.inbox.put(Start(fut, reset, gpu))
        return fut

    async def stop(self, reason: str = "stopped") -> None:
        if self._discarded:
            return  # its owner ended (its worker was killed)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._owner.inbox.put(Stop(fut, reason))
        await fut

    def discard(self) -> None:
        """Forget this instance (a fresh one replaces it, or the router closes): the
        owner kills a worker still running, fails what waits, and ends."""
        if not self._discarded:
            self._discarded = True
            self._owner.inbox.put(Discard())

    async def closed(self) -> None:
        """Until the owner task has ended (after ``discard``)."""
        with contextlib.suppress(asyncio.CancelledError):
            await self._owner.task

    def submit(self, request_id: str, frame: bytes, stream: RequestStream, slotted: bool = True) -> bool:
        """Send an encoded request (sync; ``slotted=False``: it holds no slot). False when it cannot now."""
        link = self.ready_link
        return link is not None and link.submit(request_id, frame, stream, self.index, slotted)

    async def fetch_stats(self, timeout_s: float = 2.0) -> wire.Stats | None:
        link = self.ready_link
        return None if link is None else await link.fetch_stats(timeout_s)

    # ----------------------------------------------------------------- LinkOwner

    def link_message(self, link: WorkerLink, msg: LifecycleMessage) -> None:
        self._owner.inbox.put(Lifecycle(link, msg))

    def link_request_ended(self, link: WorkerLink) -> None:
        if link is self._owner.link:
            self._on_slot_free(self)

    def link_closed(self, link: WorkerLink) -> None:
        self._owner.inbox.put(Closed(link))

    def link_exited(self, link: WorkerLink, exit: LinkExit) -> None:
        self._owner.inbox.put(Exited(link, exit))
