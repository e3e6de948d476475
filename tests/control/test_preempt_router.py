"""Fair-share preemption through the router (control/scheduling/preempt.py), with fake workers that
pause and resume on Preempt/Resume: a heavy key over its share is paused when a light
key waits, resumed after, and its stream ends as it would have; abort while paused;
a worker that dies with a paused request fails it; one key alone is never paused."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from support.harness import Harness, _until
from support.keys import bearer

PIECES = [f"t{i} " for i in range(24)]
FULL = "".join(PIECES)


async def _start(harness: Harness, keys: bool = True, **server: Any) -> tuple[dict[str, str], Any]:
    script = harness.script("a", tokens=PIECES, token_delay_s=0.03)
    secrets = await harness.serve({"a": {"path": str(script), "n_parallel": 2}},
                                  keys={"heavy": {"scopes": ["infer", "manage"]}, "light": {}} if keys else None,
                                  **server)
    return secrets, harness.plane


async def _stream(c: httpx.AsyncClient, secret: str | None, prompt: str, started: asyncio.Event | None = None,
                  ) -> tuple[str, str | None]:
    """A streamed completion: its text and its finish reason."""
    text, reason = "", None
    headers = bearer(secret) if secret else {}
    async with c.stream("POST", "/v1/completions", headers=headers,
                        json={"model": "a", "prompt": prompt, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            choice = ev["choices"][0]
            text += choice["text"]
            reason = choice.get("finish_reason") or reason
            if started is not None and text:
                started.set()
    return text, reason


def _frames(harness: Harness, kind: str) -> list[str]:
    return [x["id"] for x in harness.requests_seen("a") if x.get("type") == kind]


def _prompt_of(harness: Harness, rid: str) -> str:
    return next(x["prompt"] for x in harness.requests_seen("a") if x.get("id") == rid and "prompt" in x)


async def _settled(plane: Any) -> None:
    pool = plane.pools["a"]
    q = pool.waiters
    await _until(lambda: pool.inflight == 0 and not q and q.busy_of("heavy") == q.busy_of("light") == 0)
    assert pool.preempt.paused == 0 and all(pool.busy(i) == 0 for i in pool.instances)


async def test_heavy_key_over_its_share_is_paused_for_a_light_key(harness: Harness) -> None:
    secrets, plane = await _start(harness)
    c = harness.client
    pool = plane.pools["a"]
    s0, s1 = asyncio.Event(), asyncio.Event()
    h0 = asyncio.create_task(_stream(c, secrets["heavy"], "heavy 0", s0))
    await s0.wait()
    h1 = asyncio.create_task(_stream(c, secrets["heavy"], "heavy 1", s1))
    await s1.wait()  # heavy holds both slots
    light = await _stream(c, secrets["light"], "light 0")
    assert light == (FULL, "stop")
    paused = _frames(harness, "preempt")
    assert len(paused) == 1 and _prompt_of(harness, paused[0]) == "heavy 1"  # the one that started last
    assert _frames(harness, "resume") == paused
    assert await h0 == (FULL, "stop") and await h1 == (FULL, "stop")  # only a pause in its stream
    await _settled(plane)
    stats = pool.preempt.stats
    assert stats.pauses == {"heavy": 1} and stats.kept == {"heavy": 1} and stats.paused_s["heavy"] > 0
    models = (await c.get("/models", headers=bearer(secrets["heavy"]))).json()
    entry = next(m for m in models["data"] if m["id"] == "a")
    assert entry["preemption"]["pauses"] == 1 and entry["preemption"]["keys"]["heavy"]["pauses"] == 1
    metrics = (await c.get("/metrics", headers=bearer(secrets["heavy"]))).text
    assert 'corral_preemptions_total{key="heavy",model="a"} 1.0' in metrics


async def test_abort_while_paused_gives_every_slot_back(harness: Harness) -> None:
    secrets, plane = await _start(harness)
    c = harness.client
    pool = plane.pools["a"]
    s0 = asyncio.Event()
    h0 = asyncio.create_task(_stream(c, secrets["heavy"], "heavy 0", s0))
    await s0.wait()
    s1 = asyncio.Event()
    h1 = asyncio.create_task(_stream(c, secrets["heavy"], "FOREVER heavy 1", s1))
    await s1.wait()
    light = asyncio.create_task(_stream(c, secrets["light"], "light 0"))
    await _until(lambda: pool.preempt.paused == 1 and bool(_frames(harness, "preempt")))
    h1.cancel()  # the client of the paused request leaves
    await _until(lambda: bool(_frames(harness, "abort")))
    assert await light == (FULL, "stop") and await h0 == (FULL, "stop")
    await _settled(plane)
    assert _frames(harness, "resume") == []
    assert (await _stream(c, secrets["light"], "after")) == (FULL, "stop")  # slots work as before


async def test_a_worker_dying_with_a_paused_request_fails_it(harness: Harness) -> None:
    secrets, plane = await _start(harness)
    c = harness.client
    pool = plane.pools["a"]
    s0, s1 = asyncio.Event(), asyncio.Event()
    h0 = asyncio.create_task(_stream(c, secrets["heavy"], "FOREVER 0", s0))
    await s0.wait()
    h1 = asyncio.create_task(_stream(c, secrets["heavy"], "FOREVER 1", s1))
    await s1.wait()
    r = await c.post("/v1/completions", headers=bearer(secrets["light"]), json={"model": "a", "prompt": "BOOM"})
    assert r.status_code >= 500  # the light request crashed the worker
    assert len(_frames(harness, "preempt")) == 1
    for t in (h0, h1):  # the running one and the paused one fail alike (an error event or a cut stream)
        try:
            text, reason = await t
        except (AssertionError, httpx.HTTPError):
            continue
        assert reason is None, (text, reason)
    await _until(lambda: pool.preempt.paused == 0 and pool.inflight == 0)


async def test_one_key_alone_is_never_paused(harness: Harness) -> None:
    _, plane = await _start(harness, keys=False)
    c = harness.client
    results = await asyncio.gather(*(_stream(c, None, f"p{i}") for i in range(4)))
    assert all(r == (FULL, "stop") for r in results)
    assert _frames(harness, "preempt") == []


async def test_preemption_can_be_turned_off(harness: Harness) -> None:
    secrets, plane = await _start(harness, preempt=False)
    c = harness.client
    s0, s1 = asyncio.Event(), asyncio.Event()
    h = [asyncio.create_task(_stream(c, secrets["heavy"], "heavy 0", s0))]
    await s0.wait()
    h.append(asyncio.create_task(_stream(c, secrets["heavy"], "heavy 1", s1)))
    await s1.wait()
    assert (await _stream(c, secrets["light"], "light")) == (FULL, "stop")
    assert [await t for t in h] == [(FULL, "stop")] * 2
    assert _frames(harness, "preempt") == []
    await _settled(plane)


async def test_a_request_that_cannot_pause_keeps_its_slot(harness: Harness) -> None:
    secrets, plane = await _start(harness)
    c = harness.client
    pool = plane.pools["a"]
    s0, s1 = asyncio.Event(), asyncio.Event()
    h0 = asyncio.create_task(_stream(c, secrets["heavy"], "NOPAUSE 0", s0))
    await s0.wait()
    h1 = asyncio.create_task(_stream(c, secrets["heavy"], "NOPAUSE 1", s1))
    await s1.wait()
    light = asyncio.create_task(_stream(c, secrets["light"], "light"))
    await _until(lambda: bool(_frames(harness, "preempt")))
    await _until(lambda: pool.preempt.paused == 0)  # Paused(paused=False): it runs on, its slot taken back
    # the light request went out behind the Preempt (the slot was handed over as it was sent):
    # it waits in the worker until a slot frees; the pool counts all three
    assert pool.busy(pool.instances[0]) == 3
    assert await light == (FULL, "stop") and await h0 == (FULL, "stop") and await h1 == (FULL, "stop")
    await _settled(plane)
    assert pool.preempt.stats.pauses == {"heavy": 0} and _frames(harness, "resume") == []


async def test_a_resumed_sequence_is_not_paused_again_at_once(harness: Harness) -> None:
    secrets, plane = await _start(harness, preempt_min_run_s=60)
    c = harness.client
    s0, s1 = asyncio.Event(), asyncio.Event()
    h0 = asyncio.create_task(_stream(c, secrets["heavy"], "FOREVER heavy 0", s0))
    await s0.wait()
    h1 = asyncio.create_task(_stream(c, secrets["heavy"], "FOREVER heavy 1", s1))
    await s1.wait()
    assert (await _stream(c, secrets["light"], "light 0")) == (FULL, "stop")
    await _until(lambda: len(_frames(harness, "resume")) == 1)  # heavy 1 runs again
    assert (await _stream(c, secrets["light"], "light 1")) == (FULL, "stop")
    first, second = _frames(harness, "preempt")
    # heavy 1 started last, but it was just resumed: heavy 0 gives its slot this time
    assert (_prompt_of(harness, first), _prompt_of(harness, second)) == ("FOREVER heavy 1", "FOREVER heavy 0")
    await _until(lambda: len(_frames(harness, "resume")) == 2)
    h0.cancel()
    h1.cancel()
    await asyncio.gather(h0, h1, return_exceptions=True)
    await _settled(plane)
