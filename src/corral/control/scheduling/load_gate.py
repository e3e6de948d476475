"""Whose load goes next: the admission lock, handed over by the keys' shares.

Loads that must make room (one model at a time: ``max_loaded_models``, a memory budget)
take turns, one deciding at a time (``Admission``). Which waiting load goes next is not
whoever asked first: it is the one whose request's key is furthest below its share, as
in a model's queue (``corral.control.scheduling.fair_queue``): the fewest busy slots over every
model per unit of weight, then the fewest turns granted here per unit of weight (a key
whose models were loaded often waits behind one whose were not), then the oldest.
Every request that autoloads a model asks for a turn under its own key; once its model
is loaded, the turns of its other requests pass at once (nothing to decide).

Everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from corral.control.scheduling.fair_queue import requester

__all__ = ["LoadGate"]


@dataclass(eq=False, slots=True)
class _Turn:
    fut: asyncio.Future[None]
    key: str
    weight: float
    seq: int


class LoadGate:
    def __init__(self, busy_of: Callable[[str], int]) -> None:
        self._busy_of = busy_of  # a key's busy slots over every model
        self._held = False
        self._waiting: list[_Turn] = []
        self._granted: dict[str, int] = {}
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold the gate (like ``async with lock``), entered in the keys' fair order."""
        who = requester()  # a load's turn is taken deep in admission: the caller read here
        key, weight = who.key, who.weight
        if self._held or self._waiting:
            t = _Turn(asyncio.get_running_loop().create_future(), key, weight, next(self._seq))
            self._waiting.append(t)
            try:
                await t.fut
            except asyncio.CancelledError:
                if t in self._waiting:
                    self._waiting.remove(t)
                elif t.fut.done() and not t.fut.cancelled():
                    self._hand_over()  # it was handed the gate as it left
                raise
        else:
            self._held = True
        self._granted[key] = self._granted.get(key, 0) + 1
        try:
            yield
        finally:
            self._hand_over()

    def _hand_over(self) -> None:
        if not self._waiting:
            self._held = False
            return
        nxt = min(self._waiting, key=lambda t: (self._busy_of(t.key) / t.weight,
                                                self._granted.get(t.key, 0) / t.weight, t.seq))
        self._waiting.remove(nxt)
        nxt.fut.set_result(None)  # the gate stays held: it passes to nxt
