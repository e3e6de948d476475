"""Choosing how many CPU threads a decode uses, from what the other processes use.

ggml's threads meet at a barrier after every graph node. If they do not each have a
core, a step gets many times slower (a waiting thread spins on the core the late thread
needs; see docs/internals/thread-governor.md for numbers). Fewer threads than cores never hit this.

``ThreadGovernor`` reads /proc/stat (all CPUs) and /proc/self/stat (this process) about
four times a second, estimates how many cores the OTHER processes kept busy, and sets the
decode threads to the cores left, between 1 and the configured number:

    want = clamp(floor(n_cpus - others + 0.5), 1, configured)

Two busy workers on 2 cores thus settle at 1 thread each; a worker alone gets all it was
given. Not on Linux (no /proc): the configured number, unchanged. ``free_cores`` (the same
estimate, not capped by the configured number) caps the threads that sample a step
(worker/sampling/pool.py): they run between decodes, on the cores the decode threads use.

The window is blind to what happened at its end: a worker that sat idle next to a busy
one has settled on fewer threads, and when its neighbour goes quiet and a request comes,
the next decision is up to ``interval_s`` away (a short request runs all of it on too few
threads). So when work arrives at an idle engine, ``wake()`` looks at the threads runnable
right now (``procs_running`` in /proc/stat, less this process's own and the router's if it
is running: it just handed over the work). If there is room it takes the threads back at
once; it never lowers them (at that instant the router and the client are often running).
It starts a fresh measuring window, a short one (0.1 s), so that a count the idle spell
left wrong is put right quickly.

Niced processes (``nice`` > 0: background builds, test suites) give their cores back to
a worker at normal priority, so they do not count as others when the worker itself is
not niced: /proc/stat keeps their time apart ("nice" column), and at ``wake()`` the
runnable threads are lessened by the cores niced processes used lately (an average over
the last windows), since ``procs_running`` cannot tell them apart. A niced worker counts
everything, as before.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

__all__ = ["ThreadGovernor", "cpu_jiffies", "parent_running", "runnable_threads"]

log = logging.getLogger("corral.worker.host.cpu")

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_jiffies() -> tuple[float, float, float] | None:
    """(busy jiffies of all CPUs at normal priority, busy jiffies of this process, jiffies
    of niced processes), or None without /proc."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        vals = [int(x) for x in fields[1:9]]
        busy = vals[0] + vals[2] + vals[5] + vals[6] + vals[7]
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        rest = stat[stat.rindex(b")") + 2 :].split()
        ours = int(rest[11]) + int(rest[12])  # utime, stime (fields 14, 15)
        return float(busy), float(ours), float(vals[1])
    except (OSError, ValueError, IndexError):
        return None


def _niceness() -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, 0)
    except (OSError, AttributeError):
        return 0


def runnable_threads() -> int | None:
    """Threads runnable on the whole machine at this instant (``procs_running``)."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def parent_running() -> int:
    """1 if the parent process (the router, which just handed us the work) is running at
    this instant, else 0."""
    try:
        with open(f"/proc/{os.getppid()}/stat", "rb") as f:
            stat = f.read()
        return 1 if stat[stat.rindex(b")") + 2 :][:1] == b"R" else 0
    except (OSError, ValueError):
        return 0


class ThreadGovernor:
    def __init__(
        self,
        configured: int,
        apply: Callable[[int], None],
        *,
        n_cpus: int | None = None,
        interval_s: float = 0.25,
        read: Callable[[], tuple[float, ...] | None] = cpu_jiffies,
        clock: Callable[[], float] = time.monotonic,
        running: Callable[[], int | None] = runnable_threads,
        parent_running: Callable[[], int] = lambda: 0,
        niced: bool | None = None,
    ) -> None:
        self.configured = max(1, configured)
        self.current = self.configured
        self.n_cpus = n_cpus or len(os.sched_getaffinity(0))
        self.free_cores = self.n_cpus  # cores the others leave free (the sampling threads' cap)
        self.interval_s = interval_s
        self._apply = apply
        self._read = read
        self._clock = clock
        self._running = running
        self._parent_running = parent_running
        # a niced worker competes with niced processes on equal terms: count them as others
        self.niced = _niceness() > 0 if niced is None else niced
        self.nice_cores = 0.0  # cores niced processes used, averaged over the last windows
        # the first window of a busy spell is short: a wrong count left by the idle spell
        # (a neighbour just stopped, or started with us) is put right within 0.1 s
        self.wake_window_s = min(0.1, interval_s)
        self._after_wake = False
        self._last = read()
        self._t_last = clock()
        self.enabled = self.configured > 1 and self._last is not None

    def tick(self) -> None:
        """Call between steps; re-decides at most every ``interval_s``."""
        if not self.enabled:
            return
        now = self._clock()
        if now - self._t_last < (self.wake_window_s if self._after_wake else self.interval_s):
            return
        self._after_wake = False
        cur = self._read()
        if cur is None or self._last is None:
            return
        dt = now - self._t_last
        busy = (cur[0] - self._last[0]) / _TICK
        ours = (cur[1] - self._last[1]) / _TICK
        nice = (cur[2] - self._last[2]) / _TICK if len(cur) > 2 and len(self._last) > 2 else 0.0
        self._last, self._t_last = cur, now
        self.nice_cores = 0.5 * self.nice_cores + 0.5 * nice / dt
        if self.niced:
            busy += nice
        others = max(0.0, busy - ours) / dt
        self.free_cores = max(1, min(self.n_cpus, math.floor(self.n_cpus - others + 0.5)))
        want = min(self.configured, self.free_cores)
        if want != self.current:
            log.info("decode threads %d -> %d: other processes used %.2f cores", self.current, want, others)
            self.current = want
            self._apply(want)

    def wake(self) -> None:
        """Work arrived at an idle engine: if fewer threads run at this instant than the
        last window said, take the cores back now; and measure the coming busy spell
        afresh. Never fewer threads here: the instant work arrives, the router and the
        client that sent it are often running too, and counting them cost a lone model a
        quarter second on half its cores at every wave of requests (seen at c=8: 3 drops
        in 7 s). A neighbour that really is busy shows in the next window."""
        if not self.enabled:
            return
        running = self._running()
        cur = self._read()
        if running is None or cur is None:
            return
        self._last, self._t_last = cur, self._clock()
        self._after_wake = True
        others = max(0, running - 1 - self._parent_running())  # the router handing us the work
        if not self.niced:  # runnable niced threads will yield: leave out as many as lately ran
            others = max(0, others - math.floor(self.nice_cores + 0.5))
        free = max(1, min(self.n_cpus, self.n_cpus - others))
        self.free_cores = max(self.free_cores, free)  # only up here, too
        want = min(self.configured, free)
        if want > self.current:
            log.info("decode threads %d -> %d on waking: %d other threads runnable", self.current, want, others)
            self.current = want
            self._apply(want)
