"""Which cores a worker keeps to while the governor runs it on fewer threads than cores.

Two busy workers at one thread each on a 2-core machine, left to the OS scheduler, share
a core now and then (the router's and the clients' threads come and go between them):
measured with workers reached directly (``bench/run.py --only multimodel``, the second
table), two 1-thread workers pinned to a core each gave 0.89x of one 2-thread worker,
two left to the governor unpinned 0.81x, in the same run. So when the governor lowers
the decode threads, the worker pins all its threads to that many cores, chosen from its
``cpu_slot`` (the router gives each of its local workers a different one) so that busy
neighbours take different cores; when the threads go back up, the pin is lifted.

Only with a ``cpu_slot`` (local workers; a Ray worker has none) and only on Linux.
"""

from __future__ import annotations

import logging
import os

__all__ = ["CorePlacer"]

log = logging.getLogger("corral.worker.cores")


class CorePlacer:
    def __init__(self, slot: int | None, allowed: set[int] | None = None) -> None:
        self.slot = slot
        if allowed is None and hasattr(os, "sched_getaffinity"):
            allowed = set(os.sched_getaffinity(0))
        self.allowed = sorted(allowed or ())
        self.pinned: set[int] | None = None

    @property
    def enabled(self) -> bool:
        return self.slot is not None and len(self.allowed) > 1 and hasattr(os, "sched_setaffinity")

    def cores_for(self, threads: int) -> set[int] | None:
        """The cores for ``threads`` decode threads; None: all of them (no pin)."""
        n = len(self.allowed)
        if self.slot is None or threads >= n:
            return None
        start = (self.slot * threads) % n
        return {self.allowed[(start + i) % n] for i in range(max(1, threads))}

    def apply(self, threads: int) -> None:
        """Pin (or unpin) every thread of this process for ``threads`` decode threads."""
        if not self.enabled:
            return
        cores = self.cores_for(threads)
        if cores == self.pinned:
            return
        mask = cores if cores is not None else set(self.allowed)
        try:
            for tid in os.listdir("/proc/self/task"):
                try:
                    os.sched_setaffinity(int(tid), mask)
                except (ProcessLookupError, PermissionError):
                    continue  # a thread that just ended
        except OSError as exc:
            log.warning("could not set the CPU affinity: %s", exc)
            return
        self.pinned = cores
        if cores is not None:
            log.info("threads pinned to cores %s", sorted(cores))
        else:
            log.info("threads free on all cores again")
