"""What goes into an instance's inbox: commands from callers and news from its link.

Only the instance's owner task takes items out (``corral.control.instance.instance``). News
carries the link it came from, so the owner can tell the current worker from an
earlier one. The inbox also says what its commands are about to do before the owner
gets to them: whether a start is pending (queued or being carried out) and the GPU
placement the latest such start brings.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from corral.control.placement.gpu_slot import GpuSlot
from corral.control.transport.link import LifecycleMessage, LinkExit, WorkerLink

__all__ = ["Start", "Stop", "Discard", "RestartDue", "Lifecycle", "Closed", "Exited",
           "LoadTimeout", "Item", "Inbox", "Kept", "KEPT", "resolve", "resolve_all", "fail_all", "consume"]


class Kept(enum.Enum):
    """A start that keeps the instance's GPU placement as it is."""

    KEPT = "kept"


KEPT = Kept.KEPT


@dataclass(slots=True)
class Start:
    reply: asyncio.Future[None]
    reset: bool
    gpu: GpuSlot | None | Kept = KEPT  # where admission placed it (None: no GPU), or KEPT


@dataclass(slots=True)
class Stop:
    reply: asyncio.Future[None]
    reason: str


@dataclass(slots=True)
class Discard:
    pass


@dataclass(slots=True)
class RestartDue:
    pass


@dataclass(slots=True)
class Lifecycle:
    link: WorkerLink
    msg: LifecycleMessage


@dataclass(slots=True)
class Closed:
    link: WorkerLink


@dataclass(slots=True)
class Exited:
    link: WorkerLink
    exit: LinkExit


@dataclass(slots=True)
class LoadTimeout:
    link: WorkerLink


Item = Start | Stop | Discard | RestartDue | Lifecycle | Closed | Exited | LoadTimeout


class Inbox:
    def __init__(self) -> None:
        self._q: asyncio.Queue[Item] = asyncio.Queue()
        self._starts: list[Start] = []  # put and not yet handled, oldest first

    def put(self, item: Item) -> None:
        if isinstance(item, Start):
            self._starts.append(item)
        self._q.put_nowait(item)

    async def get(self) -> Item:
        return await self._q.get()

    def handled(self, item: Item) -> None:
        """The owner is done with ``item``."""
        if isinstance(item, Start):
            self._starts.remove(item)

    @property
    def start_pending(self) -> bool:
        """A start is queued or being carried out."""
        return bool(self._starts)

    def pending_gpu(self) -> GpuSlot | None | Kept:
        """The placement the latest pending start that brings one brings (KEPT: none does)."""
        for start in reversed(self._starts):
            if start.gpu is not KEPT:
                return start.gpu
        return KEPT

    def close(self, exc: Exception) -> None:
        """The owner is gone: starts still queued fail with ``exc``, stops are done."""
        self._starts.clear()
        while not self._q.empty():
            item = self._q.get_nowait()
            if isinstance(item, Start) and not item.reply.done():
                item.reply.set_exception(exc)
            elif isinstance(item, Stop):
                resolve(item.reply)


def resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def resolve_all(futures: list[asyncio.Future[None]]) -> None:
    """Resolve every future in ``futures`` and empty the list."""
    waiting = futures[:]
    futures.clear()
    for fut in waiting:
        resolve(fut)


def fail_all(futures: list[asyncio.Future[None]], exc: Exception) -> None:
    """End every future in ``futures`` with ``exc`` and empty the list."""
    waiting = futures[:]
    futures.clear()
    for fut in waiting:
        if not fut.done():
            fut.set_exception(exc)


def consume(fut: asyncio.Future[None]) -> None:
    """Done callback: mark an outcome nobody awaits as retrieved (the pool reads
    outcomes from the instance's state)."""
    if not fut.cancelled():
        fut.exception()
