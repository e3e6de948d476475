"""`corral serve` stopped by SIGTERM / SIGINT while requests run (api/shutdown.py): a real
router process and its worker; the requests are in the worker's slots (and one in the
queue) when the signal comes. Each non-streamed one is answered 503 in the API's shape (not
uvicorn's plain 500), the stream ends with its error event (not cut off), the router exits."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path

import httpx
import pytest

from reliability.server import real_models, wait_until

LONG = {"model": "m", "prompt": "Count to a thousand:", "max_tokens": 900, "ignore_eos": True}


def _state(r) -> tuple[int, int]:  # noqa: ANN001
    """(busy slots, queued requests) of model m, read from the router."""
    models = httpx.get(f"{r.base_url}/models", timeout=10).json()["data"]
    busy = sum(i["slots"]["busy"] for m in models for i in m.get("instances", []))
    metrics = httpx.get(f"{r.base_url}/metrics", timeout=10).text
    queued = re.search(r'^corral_queue_depth\{model="m"\} (\S+)$', metrics, re.M)
    return busy, int(float(queued.group(1))) if queued else 0


async def _stream_lines(c: httpx.AsyncClient, first: asyncio.Event) -> list[str]:
    lines = []
    async with c.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                first.set()
    return lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_answers_running_and_queued_requests_with_503(routers, model_path: Path,  # noqa: ANN001
                                                                     sig: signal.Signals) -> None:
    r = routers(real_models(model_path, "m", ctx_len=2048, n_parallel=2), shutdown_timeout_s=0)
    async with r.aclient(timeout=120) as c:
        assert (await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 1})).status_code == 200
        first = asyncio.Event()
        streamed = asyncio.ensure_future(_stream_lines(c, first))
        await asyncio.wait_for(first.wait(), 60)  # the stream is in a slot, generating
        whole = asyncio.ensure_future(c.post("/v1/completions", json=LONG))
        await asyncio.to_thread(wait_until, lambda: _state(r) == (2, 0), 60, "the second request in a slot")
        queued = asyncio.ensure_future(c.post("/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 900}))
        await asyncio.to_thread(wait_until, lambda: _state(r) == (2, 1), 60, "the third request in the queue")
        assert r.proc is not None
        r.proc.send_signal(sig)
        lines, resp, waited = await asyncio.gather(streamed, whole, queued)
    for answer in (resp, waited):
        assert answer.status_code == 503, answer.text
        err = answer.json()["error"]  # the OpenAI shape
        assert err["code"] == "unavailable" and "shutting down" in err["message"]
        assert answer.headers.get("retry-after") == "5"
    assert json.loads(lines[-1])["error"]["code"] == "unavailable", lines[-3:]  # its last event: the error
    assert await asyncio.to_thread(r.proc.wait, 30) is not None
    log = r.router_log()
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-2000:]
