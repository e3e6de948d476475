"""When a failed worker comes back: the restart policy of one instance (pure, no I/O).

- A failure the worker itself reports (``LoadFailed``), a load timeout or a worker
  that cannot be started is **final**: the same file would fail the same way. Only an
  explicit load (``reset``) tries again.
- A crash **during load or right after ready** (within ``settle_s``) is part of a
  crash loop. After ``max_restarts`` such crashes in a row the instance stays failed;
  a request for it may try again once the backoff since the last crash has passed
  (``retry_due``), so a model is never failed for good by a passing fault.
- A crash of a worker that had been ready longer than that (it served) always
  restarts: the crash-loop count starts over.
- Backoff: ``backoff_s × 2^(n-1)``, at most ``max_backoff_s``, where n counts the
  failures in a row; a worker ready for ``stable_s`` starts the count over.

Field note behind this: a worker killed every 30 s under load came back three times,
then stayed failed (its ready spells, 25-27 s, never reached the 30 s that reset the
count) and 944 requests got 503 until someone loaded it by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RestartPolicy", "RestartDecision"]


@dataclass(frozen=True, slots=True)
class RestartDecision:
    restart: bool  # restart by itself after ``delay_s``
    delay_s: float
    final: bool  # no automatic restart follows
    crash_loop: bool  # this failure counted towards the crash loop


class RestartPolicy:
    def __init__(self, *, max_restarts: int = 3, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, settle_s: float = 10.0, stable_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.settle_s = settle_s
        self.stable_s = stable_s
        self._clock = clock
        self.failures = 0  # failures in a row (backoff)
        self.crash_loop = 0  # crashes in a row during load or right after ready
        self._ready_at: float | None = None
        self._retry_at: float | None = None  # failed for good: a request may retry from then

    def reset(self) -> None:
        """An explicit load: earlier failures are forgotten."""
        self.failures = 0
        self.crash_loop = 0
        self._retry_at = None

    def on_ready(self) -> None:
        self._ready_at = self._clock()

    def backoff(self) -> float:
        n = max(1, self.failures)
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (n - 1))

    def on_failure(self, *, retryable: bool) -> RestartDecision:
        """A worker failed (``retryable``: it crashed, as opposed to a load the worker
        itself refused, a load timeout or a spawn error)."""
        now = self._clock()
        ready_for = None if self._ready_at is None else now - self._ready_at
        self._ready_at = None
        if ready_for is not None and ready_for >= self.stable_s:
            self.failures = 0
        self.failures += 1
        if not retryable:
            self._retry_at = None
            return RestartDecision(restart=False, delay_s=0.0, final=True, crash_loop=False)
        early = ready_for is None or ready_for < self.settle_s
        self.crash_loop = self.crash_loop + 1 if early else 0
        delay = self.backoff()
        if self.crash_loop > self.max_restarts:
            self._retry_at = now + delay
            return RestartDecision(restart=False, delay_s=delay, final=True, crash_loop=True)
        self._retry_at = None
        return RestartDecision(restart=True, delay_s=delay, final=False, crash_loop=early)

    def retry_due(self) -> bool:
        """Failed for good after a crash loop, and the backoff has passed: a request
        may start it again."""
        return self._retry_at is not None and self._clock() >= self._retry_at
