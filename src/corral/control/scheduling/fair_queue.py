"""A model's queue for slots: weighted fair over keys, by priority within a key.

Each waiter belongs to a key (the request's ``Caller``: its name and ``weight``; a
request without a caller is the anonymous key ``-``). When a slot frees, the next
waiter comes from the key furthest below its share:

1. the fewest busy slots of this model per unit of weight (``busy / weight``), so a key
   with 100 queued requests cannot make a key with one wait behind all of them;
2. then the least service received: its virtual time, the tokens (prompt + completion)
   of its ended requests divided by its weight. A key that becomes active again starts
   at the smallest virtual time of the keys active now: idle time banks no credit;
3. then the oldest waiter.

Within a key: the highest ``priority`` first (vLLM's field, bounded by the key's
``max_priority``), where waiting raises it by one per ``aging_s`` seconds, so a low
priority request is never starved by a stream of higher ones; equal, the oldest first.
With one key and one priority this is exactly FIFO.

Everything runs on the event loop, synchronously.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.control.keys.ring import ANONYMOUS_NAME, CALLER

if TYPE_CHECKING:
    from corral.control.instance.instance import Instance
    from corral.control.stream import RequestStream

__all__ = ["ANONYMOUS", "FairQueue", "Requester", "Waiter", "requester", "served_tokens"]

DEFAULT_AGING_S = 10.0


@dataclass(frozen=True, slots=True)
class Requester:
    """Whom a request is for, as the queue and preemption weigh it."""

    key: str = ANONYMOUS_NAME
    weight: float = 1.0
    priority: int = 0


ANONYMOUS = Requester()


def requester() -> Requester:
    """The current request's (its ``Caller``); the anonymous key outside one. Read once where
    a request is submitted (``Dispatch._send``) and passed down from there."""
    caller = CALLER.get()
    return ANONYMOUS if caller is None else Requester(caller.name, caller.key.spec.weight, caller.priority)


def served_tokens(stream: RequestStream) -> int:
    """Prompt + completion tokens of an ended worker request (what generated, if it failed)."""
    if stream.finished is not None:
        u = stream.finished.usage
        return u.prompt_tokens + u.completion_tokens
    if stream.embeddings is not None:
        return stream.embeddings.prompt_tokens
    return stream.n_tokens


@dataclass(eq=False, slots=True)
class Waiter:
    fut: asyncio.Future[Instance | None]
    prefix: str | None
    key: str
    priority: int
    seq: int
    since: float  # time.monotonic() when it queued
    instance: Instance | None = None  # a paused request: it resumes there only (control/scheduling/preempt.py)


@dataclass(slots=True)
class _KeyShare:
    weight: float
    busy: int = 0  # this model's slots running a request of the key
    vtime: float = 0.0  # tokens served / weight
    waiting: list[Waiter] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.busy > 0 or bool(self.waiting)


class FairQueue:
    def __init__(self, aging_s: Callable[[], float] = lambda: DEFAULT_AGING_S) -> None:
        self._aging_s = aging_s
        self._keys: dict[str, _KeyShare] = {}
        self._seq = itertools.count()
        self._len = 0

    # ------------------------------------------------------------------ the waiters

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Waiter]:
        """Every waiter, oldest first."""
        return iter(sorted((w for s in self._keys.values() for w in s.waiting), key=lambda w: w.seq))

    def push(self, fut: asyncio.Future[Instance | None], prefix: str | None, key: str, weight: float,
             priority: int, *, instance: Instance | None = None) -> Waiter:
        share = self._share(key, weight)
        w = Waiter(fut, prefix, key, priority, next(self._seq), time.monotonic(), instance)
        share.waiting.append(w)
        self._len += 1
        return w

    def remove(self, w: Waiter) -> bool:
        share = self._keys.get(w.key)
        if share is None or w not in share.waiting:
            return False
        share.waiting.remove(w)
        self._len -= 1
        self._forget_idle(w.key, share)
        return True

    def next(self) -> Waiter | None:
        """The waiter a free slot goes to now (not removed)."""
        best: tuple[float, float, int] | None = None
        chosen: _KeyShare | None = None
        for share in self._keys.values():
            if not share.waiting:
                continue
            rank = (share.busy / share.weight, share.vtime, share.waiting[0].seq)  # kept in seq order
            if best is None or rank < best:
                best, chosen = rank, share
        if chosen is None:
            return None
        now, aging = time.monotonic(), max(self._aging_s(), 1e-6)
        # a paused request of the key first (it started before), then by aged priority
        return max(chosen.waiting, key=lambda w: (w.instance is not None, w.priority + (now - w.since) / aging, -w.seq))

    def serve(self, w: Waiter) -> None:
        """``w`` got a slot: out of the queue, and its key has one more busy slot."""
        share = self._keys[w.key]
        share.waiting.remove(w)
        self._len -= 1
        share.busy += 1

    def take_all(self) -> list[Waiter]:
        """Remove and return every waiter, oldest first (the model went away)."""
        out = list(self)
        for share in self._keys.values():
            share.waiting.clear()
        self._len = 0
        for key, share in list(self._keys.items()):
            self._forget_idle(key, share)
        return out

    # ------------------------------------------------------------------ service

    def started(self, key: str, weight: float) -> None:
        """A request of ``key`` took a slot."""
        self._share(key, weight).busy += 1

    def ended(self, key: str, tokens: int) -> None:
        """A request of ``key`` ended (or was never sent: 0 tokens); its slot is free."""
        share = self._keys.get(key)
        if share is None:
            return
        share.busy = max(0, share.busy - 1)
        share.vtime += tokens / share.weight
        self._forget_idle(key, share)

    def track(self, stream: RequestStream, key: str) -> None:
        """When ``stream`` (a request of ``key`` on a slot) ends: ``ended`` with its tokens.
        An end handler: it runs before the link releases the slot."""
        stream.at_end(lambda s: self.ended(key, served_tokens(s)))

    def weight_of(self, key: str) -> float:
        share = self._keys.get(key)
        return share.weight if share is not None else 1.0

    def by_key(self) -> dict[str, tuple[int, int]]:
        """Each key with work here: (slots running its requests, its requests waiting)."""
        return {k: (s.busy, len(s.waiting)) for k, s in self._keys.items() if s.active}

    def busy_of(self, key: str) -> int:
        share = self._keys.get(key)
        return share.busy if share is not None else 0

    def _share(self, key: str, weight: float) -> _KeyShare:
        share = self._keys.get(key)
        if share is None:
            active = [s.vtime for s in self._keys.values() if s.active]
            share = self._keys[key] = _KeyShare(weight, vtime=min(active, default=0.0))
        share.weight = weight  # a reloaded keys file may have changed it
        return share

    def _forget_idle(self, key: str, share: _KeyShare) -> None:
        if not share.active:
            del self._keys[key]
