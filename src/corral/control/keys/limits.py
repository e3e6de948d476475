"""Per-key limits: requests and tokens per minute, tokens per day, requests in flight
and waiting.

- **rpm**: a token bucket of ``rpm`` requests refilled at rpm/60 per second; a request
  takes one when it arrives.
- **tpm**: a bucket of ``tpm`` tokens, refilled likewise. **tpd**: prompt + completion
  tokens of the current UTC day; at the limit, requests are refused until midnight UTC.
  Seeded at startup from the usage kept on disk. Both are hard: an HTTP request is
  admitted while both have tokens left (``admit``), and each worker request it sends
  first ``reserve``s what it may use (at most what is left of both, so requests in
  flight together can never take more than the limit); the worker is told that budget
  (``GenerateRequest.token_budget``) and stops there. When it ends, ``settle`` gives
  back what it did not use.
- **concurrency**: requests in flight. One more waits (first come, first served) for a
  place, at most ``queue`` of them (absent: no bound but ``[server] queue_timeout_s``);
  past that, or after the wait, 429.

A refusal is ``RateLimited`` (429) with ``Retry-After`` (when asking again can work) and
the ``x-ratelimit-*`` headers OpenAI sends; they are also sent on every admitted
request of a key with rpm or tpm. State is per key name (a rotated key keeps its
budget) and lives in the router's memory.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable

from corral.errors import RateLimited
from corral.config.keys_file import KeySpec

__all__ = ["Limiter", "Reservation", "format_reset", "utc_day"]


def utc_day(now: float | None = None) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


def _to_midnight(now: float) -> float:
    return 86400.0 - (now % 86400.0)


def format_reset(seconds: float) -> str:
    """OpenAI's duration format: ``20ms``, ``1s``, ``6m0s``, ``1h2m3s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    s = math.ceil(seconds)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    return f"{m}m{s}s" if m else f"{s}s"


class Reservation:
    """Tokens a worker request of key ``name`` holds of its tpm and tpd (``day``: the UTC
    day they were taken from)."""

    __slots__ = ("day", "name", "spec", "tokens")

    def __init__(self, name: str, spec: KeySpec, tokens: int, day: str) -> None:
        self.name = name
        self.spec = spec
        self.tokens = tokens
        self.day = day


class _Bucket:
    __slots__ = ("capacity", "level", "stamp")

    def __init__(self, capacity: int, now: float) -> None:
        self.capacity = capacity
        self.level = float(capacity)
        self.stamp = now

    def refill(self, capacity: int, now: float) -> None:
        if capacity != self.capacity:  # the limit changed (keys file reloaded)
            self.level = min(self.level, float(capacity))
            self.capacity = capacity
        rate = self.capacity / 60.0
        self.level = min(float(self.capacity), self.level + (now - self.stamp) * rate)
        self.stamp = now

    def wait_for(self, need: float) -> float:
        """Seconds until the level reaches ``need``."""
        return max(0.0, (need - self.level) / (self.capacity / 60.0))

    def reset_s(self) -> float:
        return self.wait_for(float(self.capacity))


class _KeyState:
    __slots__ = ("day", "day_tokens", "in_flight", "requests", "tokens", "waiters")

    def __init__(self) -> None:
        self.requests: _Bucket | None = None
        self.tokens: _Bucket | None = None
        self.day = ""
        self.day_tokens = 0
        self.in_flight = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()


class Limiter:
    def __init__(self, day_tokens: Callable[[str, str], int] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``day_tokens(key, day)``: tokens already used that day (the usage on disk)."""
        self._states: dict[str, _KeyState] = {}
        self._day_tokens = day_tokens
        self._clock = clock

    def _state(self, name: str, spec: KeySpec, now: float) -> _KeyState:
        st = self._states.get(name)
        if st is None:
            st = self._states[name] = _KeyState()
        if spec.rpm is not None:
            if st.requests is None:
                st.requests = _Bucket(spec.rpm, now)
            st.requests.refill(spec.rpm, now)
        if spec.tpm is not None:
            if st.tokens is None:
                st.tokens = _Bucket(spec.tpm, now)
            st.tokens.refill(spec.tpm, now)
        day = utc_day(now)
        if st.day != day:
            st.day = day
            st.day_tokens = self._day_tokens(name, day) if self._day_tokens is not None and spec.tpd else 0
        return st

    def headers(self, name: str, spec: KeySpec) -> dict[str, str]:
        """The x-ratelimit-* headers of the key's current state (empty without rpm/tpm)."""
        now = self._clock()
        st = self._state(name, spec, now)
        out: dict[str, str] = {}
        if st.requests is not None:
            out["x-ratelimit-limit-requests"] = str(st.requests.capacity)
            out["x-ratelimit-remaining-requests"] = str(max(0, math.floor(st.requests.level)))
            out["x-ratelimit-reset-requests"] = format_reset(st.requests.reset_s())
        if st.tokens is not None:
            out["x-ratelimit-limit-tokens"] = str(st.tokens.capacity)
            out["x-ratelimit-remaining-tokens"] = str(max(0, math.floor(st.tokens.level)))
            out["x-ratelimit-reset-tokens"] = format_reset(st.tokens.reset_s())
        return out

    def _refuse(self, name: str, spec: KeySpec, message: str, retry_s: float, kind: str) -> RateLimited:
        return RateLimited(message, retry_after_s=retry_s, kind=kind, limit_headers=self.headers(name, spec))

    def admit(self, name: str, spec: KeySpec) -> None:
        """Take one request from the key's budget, or raise RateLimited (nothing taken)."""
        now = self._clock()
        st = self._state(name, spec, now)
        if spec.tpd is not None and st.day_tokens >= spec.tpd:
            raise self._refuse(name, spec, f"key {name!r} used its {spec.tpd} tokens per day (TPD); "
                               "the limit resets at midnight UTC", _to_midnight(now), "tokens")
        if st.tokens is not None and st.tokens.level <= 0:
            raise self._refuse(name, spec, f"key {name!r} is over its {spec.tpm} tokens per minute "
                               "(TPM)", st.tokens.wait_for(1.0), "tokens")
        if st.requests is not None:
            if st.requests.level < 1:
                raise self._refuse(name, spec, f"key {name!r} is over its {spec.rpm} requests per "
                                   "minute (RPM)", st.requests.wait_for(1.0), "requests")
            st.requests.level -= 1

    def reserve(self, name: str, spec: KeySpec, want: int) -> Reservation:
        """Take up to ``want`` tokens (at least 1) of the key's tpm and tpd ahead of a worker
        request, or raise RateLimited (nothing taken). In memory only: no disk on this path."""
        now = self._clock()
        st = self._state(name, spec, now)
        grant = want
        if spec.tpd is not None:
            grant = min(grant, spec.tpd - st.day_tokens)
            if grant < 1:
                raise self._refuse(name, spec, f"key {name!r} used or holds its {spec.tpd} tokens per day "
                                   "(TPD); the limit resets at midnight UTC", _to_midnight(now), "tokens")
        if st.tokens is not None:
            grant = min(grant, math.floor(st.tokens.level))
            if grant < 1:
                raise self._refuse(name, spec, f"key {name!r} used or holds its {spec.tpm} tokens per minute "
                                   "(TPM)", st.tokens.wait_for(1.0), "tokens")
            st.tokens.level -= grant
        st.day_tokens += grant
        return Reservation(name, spec, grant, st.day)

    def settle(self, held: Reservation, used: int) -> None:
        """The worker request that held ``held`` ended having used ``used`` tokens: what
        it did not use goes back (never more than was taken)."""
        st = self._state(held.name, held.spec, self._clock())
        back = held.tokens - max(0, used)
        if st.tokens is not None:
            st.tokens.level = min(float(st.tokens.capacity), st.tokens.level + back)
        if st.day == held.day:
            st.day_tokens -= back
        else:  # the day turned meanwhile: the usage is counted on the new day
            st.day_tokens += max(0, used)

    # ------------------------------------------------------------------ concurrency

    async def enter(self, name: str, spec: KeySpec, timeout_s: float) -> None:
        """A place among the key's requests in flight (waits in line), or RateLimited."""
        if spec.concurrency is None:
            return
        st = self._states.setdefault(name, _KeyState())
        if st.in_flight < spec.concurrency and not st.waiters:
            st.in_flight += 1
            return
        if spec.queue is not None and len(st.waiters) >= spec.queue:
            raise self._refuse(name, spec, f"key {name!r} has {spec.concurrency} requests in flight "
                               f"and {len(st.waiters)} waiting, its limits", 1.0, "requests")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        st.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            self._give_up(name, spec, st, fut)
            raise self._refuse(name, spec, f"key {name!r}: no place among its {spec.concurrency} requests "
                               f"in flight within {timeout_s:g} s", 1.0, "requests") from None
        except BaseException:
            self._give_up(name, spec, st, fut)
            raise
        # the place was handed over by leave(): in_flight already counts it

    def _give_up(self, name: str, spec: KeySpec, st: _KeyState, fut: asyncio.Future[None]) -> None:
        if fut.done() and not fut.cancelled():  # handed a place just as it gave up: pass it on
            self.leave(name, spec)
            return
        fut.cancel()
        if fut in st.waiters:
            st.waiters.remove(fut)

    def leave(self, name: str, spec: KeySpec) -> None:
        """A request that ``enter`` let in ended (``spec``: the one it entered with)."""
        if spec.concurrency is None:
            return
        st = self._states.get(name)
        if st is None:
            return
        while st.waiters:
            fut = st.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the place goes straight to the next in line
                return
        st.in_flight = max(0, st.in_flight - 1)

    def in_flight(self, name: str) -> int:
        st = self._states.get(name)
        return st.in_flight if st is not None else 0
