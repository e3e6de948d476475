"""Live numbers for the web page's charts: per model, a short history of tokens/s,
queue depth and busy slots, served as JSON at ``GET /stats``.

A ``StatsRecorder`` task samples the control plane every ``interval_s`` seconds and keeps
the last ``keep`` samples per model (5 minutes by default). Tokens/s comes from the
workers' own counters (``wire.Stats.tokens_generated``, asked for with one small
``StatsRequest`` per ready instance per sample), so a long answer shows up while it is
being written, not only when it ends. A counter that goes down (the worker restarted)
starts over from the new value.

    GET /stats   {"interval_s": 2.0, "now": UNIX_TIME,
                  "models": {ID: {"t": [UNIX_TIME, ...], "tokens_per_s": [...],
                                  "queued": [...], "busy": [...], "slots": [...],
                                  "instances": [{"index", "state", "busy", "total"}]}}}
                 (``instances``: as of the last sample)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral.api.http import json_response
from corral.control.instance.instance import InstanceState
from corral.control.plane import ControlPlane

__all__ = ["StatsRecorder", "router"]

log = logging.getLogger("corral.stats")
router = APIRouter()

_FIELDS = ("t", "tokens_per_s", "queued", "busy", "slots")


class StatsRecorder:
    """Samples ``plane`` every ``interval_s`` s; ``history()`` is what GET /stats returns."""

    def __init__(self, plane: ControlPlane, *, interval_s: float = 2.0, keep: int = 150) -> None:
        self.plane = plane
        self.interval_s = interval_s
        self.keep = keep
        self._series: dict[str, dict[str, deque[float]]] = {}
        self._instances: dict[str, list[dict[str, Any]]] = {}
        # (model, instance index) -> (pid, tokens_generated, monotonic time) of the last sample
        self._counters: dict[tuple[str, int], tuple[int | None, int, float]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="corral-stats")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # a sample must never end the recorder
                log.exception("stats sample failed")
            await asyncio.sleep(self.interval_s)

    async def sample(self) -> None:
        """Takes one sample of every model now."""
        pools = list(self.plane.pools.values())
        ready = [(p.spec.id, i) for p in pools for i in p.instances if i.state is InstanceState.READY]
        reports = await asyncio.gather(*(i.fetch_stats(timeout_s=self.interval_s) for _, i in ready),
                                       return_exceptions=True)
        now_mono = time.monotonic()
        rates: dict[str, float] = {}
        seen: set[tuple[str, int]] = set()
        for (mid, inst), rep in zip(ready, reports):
            if isinstance(rep, BaseException) or rep is None:
                continue
            key = (mid, inst.index)
            seen.add(key)
            prev = self._counters.get(key)
            self._counters[key] = (inst.pid, rep.tokens_generated, now_mono)
            if prev is None or prev[0] != inst.pid or rep.tokens_generated < prev[1]:
                continue  # first sample of this worker: no rate yet
            dt = now_mono - prev[2]
            if dt > 0:
                rates[mid] = rates.get(mid, 0.0) + (rep.tokens_generated - prev[1]) / dt
        for key in [k for k in self._counters if k not in seen]:
            del self._counters[key]
        now = time.time()
        ids = set()
        for pool in pools:
            mid = pool.spec.id
            ids.add(mid)
            series = self._series.get(mid)
            if series is None:
                series = self._series[mid] = {f: deque(maxlen=self.keep) for f in _FIELDS}
            busy = sum(pool.busy(i) for i in pool.instances)
            slots = sum(i.slots_total for i in pool.instances if i.state is InstanceState.READY)
            self._instances[mid] = [{"index": i.index, "state": i.state.value, "busy": pool.busy(i),
                                     "total": i.slots_total} for i in pool.instances]
            for field, value in (("t", round(now, 3)), ("tokens_per_s", round(rates.get(mid, 0.0), 2)),
                                 ("queued", len(pool.waiters)), ("busy", busy), ("slots", slots)):
                series[field].append(value)
        for gone in [m for m in self._series if m not in ids]:
            del self._series[gone]
            self._instances.pop(gone, None)

    def history(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "now": time.time(),
                "models": {mid: {**{f: list(s[f]) for f in _FIELDS},
                                 "instances": self._instances.get(mid, [])}
                           for mid, s in self._series.items()}}


@router.get("/stats")
async def stats(request: Request) -> Response:
    rec = getattr(request.app.state, "stats", None)
    if not isinstance(rec, StatsRecorder):
        return json_response({"interval_s": None, "now": time.time(), "models": {}})
    return json_response(rec.history())
