"""Before the first token: a client that leaves during a long prefill is a 499 (no traceback),
a stream's headers and opening event go out before the prefill ends, and counting tokens
waits behind no generation."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from support.harness import Harness, _until

SLOW_CHAT = {"model": "a", "stream": True, "messages": [{"role": "user", "content": "SLOW"}]}


async def test_a_client_leaving_before_the_first_token_is_499_without_a_traceback(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    await harness.serve({"a": {"path": str(harness.script("a", slow_delay_s=60))}})
    plane = harness.plane
    caplog.set_level(logging.INFO)
    for path, body in (("/v1/chat/completions", SLOW_CHAT),
                       ("/v1/chat/completions", {**SLOW_CHAT, "stream": False}),
                       ("/v1/responses", {"model": "a", "input": "SLOW", "stream": True})):
        async with httpx.AsyncClient(base_url=harness.base_url) as c:
            task = asyncio.create_task(c.post(path, json=body))
            await _until(lambda: plane.pools["a"].inflight == 1)
            task.cancel()
        await _until(lambda: plane.pools["a"].inflight == 0)
    metrics = (await harness.client.get("/metrics")).text
    counted = [line for line in metrics.splitlines() if line.startswith("corral_requests_total")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counted if 'status="499"' in line) == 3, counted
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]


async def test_headers_and_the_opening_event_come_before_the_first_token(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a", slow_delay_s=60))}})
    plane = harness.plane
    c = harness.client
    for path, body, opening in (("/v1/responses", {"model": "a", "input": "SLOW", "stream": True},
                                 b"event: response.created"),
                                ("/v1/chat/completions", SLOW_CHAT, b'"role":"assistant"'),
                                ("/v1/messages", {"model": "a", "max_tokens": 9, "stream": True,
                                                  "messages": [{"role": "user", "content": "SLOW"}]},
                                 b"event: message_start")):
        async with c.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            first = await r.aiter_bytes().__anext__()
            assert opening in first, first
            assert plane.pools["a"].inflight == 1 and harness.requests_seen("a")  # still before any token
        await _until(lambda: plane.pools["a"].inflight == 0)


async def test_counting_tokens_takes_no_slot(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1}}, max_queue=0)
    plane = await harness.start(cfg)
    c = harness.client
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)
        r = await c.post("/v1/messages/count_tokens", json={"model": "a", "system": "be brief",
                                                            "messages": [{"role": "user", "content": "one two"}]})
        assert r.status_code == 200 and r.json() == {"input_tokens": 4}, r.text
        r = await c.post("/v1/responses/input_tokens", json={"model": "a", "input": "one two three"})
        assert r.status_code == 200 and r.json() == {"object": "response.input_tokens", "input_tokens": 3}
        r = await c.post("/tokenize", json={"model": "a", "content": "a b"})
        assert r.status_code == 200 and r.json()["tokens"] == [0, 1]
        # a generation still waits for the slot (here: no queue, so refused)
        r = await c.post("/v1/messages", json={"model": "a", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 529
