"""Before the first token: a client that leaves during a long prefill is a 499 (no traceback),
and a stream's headers and opening event go out before the prefill ends."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from support.harness import Harness, _until

SLOW_CHAT = {"model": "a", "stream": True, "messages": [{"role": "user", "content": "SLOW"}]}


async def test_a_client_leaving_before_the_first_token_is_499_without_a_traceback(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    plane = await harness.start(harness.config({"a": {"path": str(harness.script("a", slow_delay_s=60))}}))
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
