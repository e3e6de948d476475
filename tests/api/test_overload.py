"""Past the router's own saturation (corral.api.overload): while its loop lags more than
``shed_lag_s``, requests to a model get 503 + Retry-After from their headers alone; the
rest (health, model lists) are served. The lag is set by hand: the monitor's sampler is
stopped first, so nothing else moves it."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from support.harness import Harness, chat


async def test_a_lagging_router_sheds_model_requests_before_reading_their_body(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}}, shed_lag_s=0.25)
    c = harness.client
    load = harness.app.state.load
    await load.close()  # the sampler no longer updates lag_s
    assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200

    load.lag_s = 1.0  # over shed_lag_s (0.25, the default)
    r = await c.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert r.json()["error"]["code"] == "unavailable" and "overloaded" in r.json()["error"]["message"]
    # the headers of a request whose body never comes: answered at once, the body unread
    u = urlsplit(harness.base_url)
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head.lower(), head
    # what does not reach a model is served
    assert (await c.get("/health")).status_code == 200
    assert (await c.get("/v1/models")).status_code == 200
    metrics = (await c.get("/metrics")).text
    assert "corral_shed_requests_total 2.0" in metrics, metrics
    assert len(harness.requests_seen("a")) == 1  # the shed ones never reached the worker

    load.lag_s = 0.1  # under the limit again
    assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200


async def test_shed_lag_s_zero_never_sheds(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}}, shed_lag_s=0)
    c = harness.client
    await harness.app.state.load.close()
    harness.app.state.load.lag_s = 60.0
    assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200
