"""Load attacks replayed: a heavy key's queued requests must be slowed, never failed
after their wait; a request's images are bounded (count, bytes, formats, pixels) before
they cost the router or the worker memory (issue 33, parts 7 and 8)."""

from __future__ import annotations

import asyncio

from support.harness import Harness, _until

LOAD_BOUND_S = 0.3  # [server] queue_timeout_s: bounds a load's wait for room, no longer a request's


async def test_a_request_queued_past_queue_timeout_s_still_completes(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1}},
                         queue_timeout_s=LOAD_BOUND_S)
    plane = await harness.start(cfg)
    c = harness.client
    pool = plane.pools["a"]
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: pool.inflight == 1)
        queued = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "x"}))
        await _until(lambda: len(pool.waiters) == 1)
        # the passage of time is what is tested: before, the wait failed 503 at queue_timeout_s
        await asyncio.sleep(LOAD_BOUND_S * 4)
        assert not queued.done() and len(pool.waiters) == 1
    # the long generation ended (its client closed the stream): the queued request is served
    r = await queued
    assert r.status_code == 200, r.text
    # a queued request whose client leaves is removed from the queue, as before
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: pool.inflight == 1)
        leaving = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "y"}))
        await _until(lambda: len(pool.waiters) == 1)
        leaving.cancel()
        await _until(lambda: len(pool.waiters) == 0)
        assert pool.inflight == 1
    await _until(lambda: pool.inflight == 0)
    assert [x["prompt"] for x in harness.requests_seen("a") if "prompt" in x].count("y") == 0
