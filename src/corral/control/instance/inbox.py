"""What goes into an instance's inbox: commands from callers and news from its link.

Only the instance's owner task takes items out (``corral.control.instance.instance``). News
carries the link it came from, so the owner can tell the current worker from an
earlier one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from corral.control.transport.link import LifecycleMessage, LinkExit, WorkerLink

__all__ = ["Start", "Stop", "Discard", "RestartDue", "Lifecycle", "Closed", "Exited",
           "LoadTimeout", "Item", "Inbox", "resolve", "resolve_all", "consume"]


@dataclass(slots=True)
class Start:
    reply: asyncio.Future[None]
    reset: bool


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

    def put(self, item: Item) -> None:
        self._q.put_nowait(item)

    async def get(self) -> Item:
        return await self._q.get()

    def close(self, exc: Exception) -> None:
        """The owner is gone: starts still queued fail with ``exc``, stops are done."""
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


def consume(fut: asyncio.Future[None]) -> None:
    """Done callback: mark an outcome nobody awaits as retrieved (the pool reads
    outcomes from the instance's state)."""
    if not fut.cancelled():
        fut.exception()
