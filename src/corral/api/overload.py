"""The router's own load: shedding past its saturation, and its pauses.

One asyncio loop runs every route, stream and worker link of the router. Past what its
core can carry, requests pile up in front of it: each waits longer, clients give up on
answers the router goes on paying for, and the answered share falls (a Python relay in
front of fast workers collapses there). ``LoadMonitor`` keeps it from that:

- **Lag**: a task sleeps ``INTERVAL_S`` again and again; how late it wakes up is how long
  any ready callback waits for the loop, smoothed over about ``SMOOTHING`` samples
  (``lag_s``), each counted at most ``SAMPLE_CAP_S``: a lag over the default 0.25 s takes
  several late samples in a row (a loop that stays behind), never one slow callback.
- **Shedding**: while the smoothed lag is over ``[server] shed_lag_s``, the guard
  (``corral.api.guard``) answers new requests to a model 503 with ``Retry-After``, from
  their headers alone: their bodies are never read or parsed, so a refusal costs a
  fraction of an answer and the requests already admitted keep the loop. Requests that
  do not reach a model (health, the page, management) are never shed.
- **Pauses**: ``gc.callbacks`` time each collection; the longest, their number and the
  requests shed are on ``/metrics`` (``corral_gc_pause_max_seconds``,
  ``corral_gc_collections``, ``corral_event_loop_lag_seconds``, ``corral_shed_requests``).

``freeze_startup_objects`` (``gc.freeze()``) after the start-up moves every object that
exists then (the imports, the app, the plane) out of the collector's reach, so each
collection of the oldest generation walks only what requests created since
(docs/benchmarks.md, "Router ceiling").
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["LoadMonitor", "freeze_startup_objects", "INTERVAL_S"]

INTERVAL_S = 0.02  # between lag samples
SMOOTHING = 5  # samples the smoothed lag spans (an exponential average)
SAMPLE_CAP_S = 0.5  # the most one sample counts: one slow callback (a reload, a GC pause) never sheds alone


class LoadMonitor:
    """The loop's smoothed lag, the collector's pauses, the requests shed (module docstring)."""

    def __init__(self) -> None:
        self.lag_s = 0.0
        self.gc_pause_max_s = 0.0
        self.gc_collections = 0
        self.shed = 0
        self._gc_started: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._sample(), name="corral-load-monitor")

    async def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def overloaded(self, limit_s: float) -> bool:
        """Whether a new model request is to be shed now (``limit_s``: ``shed_lag_s``; 0: never);
        counts it when so."""
        if limit_s <= 0 or self.lag_s <= limit_s:
            return False
        self.shed += 1
        return True

    async def _sample(self) -> None:
        alpha = 1 / SMOOTHING
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(INTERVAL_S)
            late = min(SAMPLE_CAP_S, max(0.0, time.perf_counter() - t0 - INTERVAL_S))
            self.lag_s += alpha * (late - self.lag_s)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._gc_started is not None:
            self.gc_pause_max_s = max(self.gc_pause_max_s, time.perf_counter() - self._gc_started)
            self.gc_collections += 1
            self._gc_started = None

    def collector(self) -> Collector:
        return _Metrics(self)


class _Metrics(Collector):
    def __init__(self, monitor: LoadMonitor) -> None:
        self.m = monitor

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        m = self.m
        yield GaugeMetricFamily("corral_event_loop_lag_seconds", "The router loop's smoothed lag", value=m.lag_s)
        yield GaugeMetricFamily("corral_gc_pause_max_seconds", "The router's longest garbage-collector pause",
                                value=m.gc_pause_max_s)
        yield CounterMetricFamily("corral_gc_collections", "The router's garbage collections",
                                  value=m.gc_collections)
        yield CounterMetricFamily("corral_shed_requests", "Model requests refused with 503 while the loop lagged",
                                  value=m.shed)


def freeze_startup_objects() -> None:
    """Collect once, then keep every object alive now out of later collections (``gc.freeze``)."""
    gc.collect()
    gc.freeze()
