"""Per-key limits: 429 with Retry-After and OpenAI's x-ratelimit-* headers, in each
dialect's error shape; concurrency and queue; the priority bound."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from support.harness import Harness, _until, chat
from support.keys import bearer

from corral.control.keys.limits import Limiter, format_reset
from corral.errors import RateLimited
from corral.config.keys_file import KeySpec

MSG = {"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


async def test_requests_per_minute_with_headers_in_every_dialect(harness: Harness) -> None:
    secrets = await harness.serve(keys={"o": {"rpm": 2}, "an": {"rpm": 1}, "ol": {"rpm": 1}})
    c = harness.client
    h = bearer(secrets["o"])
    r1 = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
    r2 = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
    assert r1.status_code == r2.status_code == 200
    assert r1.headers["x-ratelimit-limit-requests"] == "2"
    assert r1.headers["x-ratelimit-remaining-requests"] == "1"
    assert r2.headers["x-ratelimit-remaining-requests"] == "0"
    assert r2.headers["x-ratelimit-reset-requests"].endswith("s")
    r3 = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
    assert r3.status_code == 429
    assert r3.json()["error"]["code"] == "rate_limit_exceeded" and r3.json()["error"]["type"] == "requests"
    assert "RPM" in r3.json()["error"]["message"]
    assert 1 <= int(r3.headers["retry-after"]) <= 30  # one request comes back every 30 s
    assert r3.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in r3.headers  # no tpm: no token headers
    # Anthropic: rate_limit_error; Ollama: {"error": message}; both 429 with Retry-After
    h = bearer(secrets["an"])
    assert (await c.post("/v1/messages", json=MSG, headers=h)).status_code == 200
    r = await c.post("/v1/messages", json=MSG, headers=h)
    assert r.status_code == 429 and r.json() == {"type": "error", "error": {
        "type": "rate_limit_error", "message": r.json()["error"]["message"]}}
    assert "retry-after" in r.headers and r.headers["x-ratelimit-limit-requests"] == "1"
    h = bearer(secrets["ol"])
    assert (await c.post("/api/chat", json=chat("a", stream=False), headers=h)).status_code == 200
    r = await c.post("/api/chat", json=chat("a", stream=False), headers=h)
    assert r.status_code == 429 and set(r.json()) == {"error"} and "retry-after" in r.headers
    # listing models is not a model request: not counted, not limited
    assert (await c.get("/v1/models", headers=h)).status_code == 200
    text = (await c.get("/metrics", headers=bearer(secrets["o"]))).status_code
    assert text == 403  # a key without manage


async def test_tokens_per_minute_and_per_day(harness: Harness) -> None:
    secrets = await harness.serve(keys={"t": {"tpm": 3}, "d": {"tpd": 3}, "root": {"scopes": ["admin"]}})
    c = harness.client
    h = bearer(secrets["t"])
    r = await c.post("/v1/chat/completions", json=chat("a"), headers=h)  # 1 prompt + 2 completion tokens: its budget
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "3"
    await _until(lambda: harness.plane.access.limiter.headers("t", KeySpec(hash="", tpm=3))
                 ["x-ratelimit-remaining-tokens"] == "0")
    r = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
    assert r.status_code == 429 and r.json()["error"]["type"] == "tokens"
    assert "TPM" in r.json()["error"]["message"]
    assert r.headers["x-ratelimit-remaining-tokens"] == "0" and int(r.headers["retry-after"]) >= 1
    h = bearer(secrets["d"])
    assert (await c.post("/v1/completions", json={"model": "a", "prompt": "hi"}, headers=h)).status_code == 200
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "hi"}, headers=h)
    assert r.status_code == 429 and "per day" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) <= 86400
    # other keys are not touched
    assert (await c.post("/v1/completions", json={"model": "a", "prompt": "hi"},
                         headers=bearer(secrets["root"]))).status_code == 200


async def test_concurrency_and_queue(harness: Harness) -> None:
    secrets = await harness.serve(keys={"one": {"concurrency": 1, "queue": 1}, "none": {"concurrency": 1, "queue": 0}})
    c = harness.client
    limiter = harness.plane.access.limiter
    h = bearer(secrets["one"])
    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "FOREVER", stream=True), headers=h) as s1:
        assert s1.status_code == 200
        lines = s1.aiter_lines()
        assert (await anext(lines)).startswith("data: ")  # in flight
        second = asyncio.create_task(c.post("/v1/chat/completions", json=chat("a"), headers=h))
        await _until(lambda: len(limiter._states["one"].waiters) == 1)
        r3 = await c.post("/v1/chat/completions", json=chat("a"), headers=h)  # queue full
        assert r3.status_code == 429 and "in flight" in r3.json()["error"]["message"]
        assert r3.headers["retry-after"] == "1"
        assert not second.done()
    r2 = await second  # the stream ended (client left): the waiting one ran
    assert r2.status_code == 200 and r2.json()["choices"][0]["message"]["content"] == "Hello, world!"
    await _until(lambda: limiter.in_flight("one") == 0)
    h = bearer(secrets["none"])
    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "FOREVER", stream=True), headers=h) as s1:
        assert (await anext(s1.aiter_lines())).startswith("data: ")
        r = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
        assert r.status_code == 429
    await _until(lambda: limiter.in_flight("none") == 0)
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=h)).status_code == 200


async def test_priority_is_bounded_by_the_keys_max(harness: Harness) -> None:
    secrets = await harness.serve(keys={"low": {}, "high": {"max_priority": 5}, "root": {"scopes": ["admin"]}},
                                  api_key="s3cret")
    c = harness.client
    for body, path in ((chat("a"), "/v1/chat/completions"), (MSG, "/v1/messages"),
                       (chat("a", stream=False), "/api/chat")):
        assert (await c.post(path, json={**body, "priority": 5}, headers=bearer(secrets["high"]))).status_code == 200
        r = await c.post(path, json={**body, "priority": 6}, headers=bearer(secrets["high"]))
        assert r.status_code == 400 and "max_priority 5" in r.text, path
        r = await c.post(path, json={**body, "priority": 1}, headers=bearer(secrets["low"]))
        assert r.status_code == 400, path  # max_priority defaults to 0
        assert (await c.post(path, json={**body, "priority": -3}, headers=bearer(secrets["low"]))).status_code == 200
        # an admin key of the file has its own bound (0 here); the [server] api_key has none
        assert (await c.post(path, json={**body, "priority": 1}, headers=bearer(secrets["root"]))).status_code == 400
        assert (await c.post(path, json={**body, "priority": 99}, headers=bearer("s3cret"))).status_code == 200
    r = await c.post("/v1/chat/completions", json={**chat("a"), "priority": "urgent"}, headers=bearer(secrets["high"]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority"
    # a body that only mentions the word is not refused
    body = chat("a", '"priority": 99')
    r = await c.post("/v1/chat/completions", content=json.dumps(body), headers={
        **bearer(secrets["low"]), "content-type": "application/json"})
    assert r.status_code == 200


def test_buckets_refill_and_format() -> None:
    now = [1000.0]
    lim = Limiter(clock=lambda: now[0])
    spec = KeySpec(hash="", rpm=60, tpm=600)
    for _ in range(60):
        lim.admit("k", spec)
    with pytest.raises(RateLimited) as info:
        lim.admit("k", spec)
    assert info.value.headers()["Retry-After"] == "1"
    now[0] += 1.0  # one request per second comes back
    lim.admit("k", spec)
    held = lim.reserve("k", spec, 1200)  # at most what is left: the whole bucket
    assert held.tokens == 600 and lim.headers("k", spec)["x-ratelimit-reset-tokens"] == "1m0s"
    with pytest.raises(RateLimited, match="TPM"):
        lim.reserve("k", spec, 1)
    lim.settle(held, 300)  # 300 unused come back
    assert lim.headers("k", spec)["x-ratelimit-remaining-tokens"] == "300"
    assert [format_reset(s) for s in (0, 0.02, 1, 61.2, 3723)] == ["0s", "20ms", "1s", "1m2s", "1h2m3s"]


def test_reservations_are_hard_and_settle_what_was_not_used() -> None:
    now = [1000.0]
    lim = Limiter(clock=lambda: now[0])
    spec = KeySpec(hash="", tpm=100, tpd=250)
    held = [lim.reserve("k", spec, 40) for _ in range(2)]
    assert [h.tokens for h in held] == [40, 40]
    third = lim.reserve("k", spec, 40)
    assert third.tokens == 20  # what is left, not what it wanted: together never above the limit
    with pytest.raises(RateLimited, match="TPM"):
        lim.reserve("k", spec, 1)
    for h in (*held, third):
        lim.settle(h, 10)  # each used 10: the rest comes back at once
    assert lim.headers("k", spec)["x-ratelimit-remaining-tokens"] == "70"
    assert lim._states["k"].day_tokens == 30
    now[0] += 120.0  # the minute refills; the day does not
    big = lim.reserve("k", spec, 1000)
    assert big.tokens == 100
    lim.settle(big, 100)
    now[0] += 120.0
    lim.settle(lim.reserve("k", spec, 1000), 100)  # 230 used today
    now[0] += 120.0
    assert lim.reserve("k", spec, 1000).tokens == 20  # the day's last 20, though the minute has 100
    with pytest.raises(RateLimited, match="per day"):
        lim.reserve("k", spec, 1)
    assert lim.reserve("other", spec, 5).tokens == 5  # keys do not share


def test_token_need_bounds_what_a_request_may_use() -> None:
    from corral import wire
    from corral.control.keys.access import token_need

    def gen(**kw: Any) -> wire.GenerateRequest:
        return wire.GenerateRequest(id="r", **kw)

    assert token_need(gen(prompt_tokens=[1, 2, 3], params=wire.SamplingParams(max_tokens=5)), 512) == 9
    small = token_need(gen(prompt="hi", params=wire.SamplingParams(max_tokens=1)), 512)
    assert 3 < small < 512  # the encoded request bounds its prompt
    assert token_need(gen(prompt="hi"), 512) == 512  # no max_tokens: the slot's context
    img = [wire.ChatMessage("user", "<__media__>", images=[b"x"])]
    assert token_need(gen(messages=img, params=wire.SamplingParams(max_tokens=1)), 512) == 512
    assert token_need(wire.EmbedRequest(id="e", inputs=["abc", "de"]), 512) == 3 + 2 + 16
    assert token_need(wire.TokenizeRequest(id="t", text="abc"), 512) == 0


async def test_a_request_holds_its_reservation_until_it_ends_and_gets_the_rest_back(harness: Harness) -> None:
    secrets = await harness.serve(keys={"k": {"tpm": 100000}})
    c = harness.client
    limiter = harness.plane.access.limiter
    frozen = time.time()
    limiter._clock = lambda: frozen  # no refill meanwhile: what comes back is exactly the unused rest
    spec = KeySpec(hash="", tpm=100000)
    h = bearer(secrets["k"])

    def taken() -> int:
        return 100000 - int(limiter.headers("k", spec)["x-ratelimit-remaining-tokens"])

    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "FOREVER", stream=True), headers=h) as s:
        assert (await anext(s.aiter_lines())).startswith("data: ")
        held = taken()
        assert held >= 512  # no max_tokens: a whole slot's context is held while it runs
    await _until(lambda: harness.plane.pools["a"].inflight == 0)  # the worker ended it: settled
    before = taken()
    assert before <= held  # it ended: at most what it held stays taken
    r = await c.post("/v1/chat/completions", json=chat("a", "hi"), headers=h)  # no max_tokens: a slot held too
    assert r.status_code == 200, r.text
    used = r.json()["usage"]["total_tokens"]
    assert taken() - before == used < held  # what it did not use came back at its end
