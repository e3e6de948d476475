"""GET /stats: the page's chart data (tokens/s from the workers' counters, queue, busy slots)."""

from __future__ import annotations

import asyncio

from corral.api.page.live_stats import StatsRecorder
from support.harness import Harness, chat


async def test_samples_tokens_per_second_busy_slots_and_queue(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1},
                          "b": {"path": str(harness.script("b"))}})
    plane = await harness.start(cfg)
    rec = StatsRecorder(plane, interval_s=3600)  # sampled by hand below
    await rec.sample()
    r = await harness.client.post("/models/load", json={"model": "a"})
    assert r.status_code == 200
    await rec.sample()  # the first sample of a worker: its counter, no rate yet
    r = await harness.client.post("/v1/chat/completions", json=chat("a", max_tokens=3))
    assert r.json()["usage"]["completion_tokens"] == 3
    await rec.sample()
    a = rec.history()["models"]["a"]
    assert len(a["t"]) == 3 and a["slots"] == [0, 1, 1]
    assert a["tokens_per_s"][:2] == [0.0, 0.0] and a["tokens_per_s"][2] > 0
    assert rec.history()["models"]["b"]["tokens_per_s"] == [0.0, 0.0, 0.0]
    # one request holds the only slot, a second waits in the queue
    held = asyncio.create_task(harness.client.post("/v1/chat/completions", json=chat("a", "FOREVER", stream=True)))
    queued = asyncio.create_task(harness.client.post("/v1/chat/completions", json=chat("a", max_tokens=1)))
    async with asyncio.timeout(10):
        while not plane.pools["a"].waiters:
            await asyncio.sleep(0.01)  # the queue has no event to await
    await rec.sample()
    a = rec.history()["models"]["a"]
    assert a["busy"][-1] == 1 and a["queued"][-1] == 1 and a["tokens_per_s"][-1] > 0
    assert a["instances"] == [{"index": 0, "state": "ready", "busy": 1, "total": 1}]
    held.cancel()
    queued.cancel()
    await asyncio.gather(held, queued, return_exceptions=True)


async def test_stats_route_and_a_removed_model(harness: Harness) -> None:
    await harness.serve()
    rec: StatsRecorder = harness.app.state.stats
    await rec.sample()
    r = await harness.client.get("/stats")
    assert r.status_code == 200
    body = r.json()
    assert body["interval_s"] == rec.interval_s and set(body["models"]) == {"a"}
    assert set(body["models"]["a"]) == {"t", "tokens_per_s", "queued", "busy", "slots", "instances"}
    await harness.plane.remove_model("a")
    await rec.sample()
    assert rec.history()["models"] == {}
