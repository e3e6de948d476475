"""One set of request bounds (router and worker), and no failure leaks a slot."""

from __future__ import annotations

import asyncio

import pytest

from corral import wire
from corral.errors import InvalidRequest
from support.harness import Harness, chat

BIG = 2**64


async def test_huge_numbers_are_refused_before_a_slot_is_taken(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 4}}, queue_timeout_s=3.0)
    plane = await harness.start(cfg)
    c = harness.client
    rs = await asyncio.gather(*(c.post("/v1/chat/completions", json=chat("a", max_tokens=BIG))
                                for _ in range(4)))
    for r in rs:
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    r = await c.post("/v1/chat/completions", json=chat("a"))  # all four slots are free
    assert r.status_code == 200, r.text
    assert plane.pools["a"].inflight == 0


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "seed", "top_k",
                                   "temperature", "repeat_penalty",
                                   "presence_penalty"])
async def test_every_numeric_field_is_bounded(harness: Harness, field: str) -> None:
    await harness.serve()
    plane = harness.plane
    r = await harness.client.post("/v1/completions", json={"model": "a", "prompt": "x", field: BIG})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert harness.requests_seen("a") == [] and plane.pools["a"].inflight == 0


async def test_router_and_worker_agree_on_zero(harness: Harness) -> None:
    """repeat_penalty 0 was accepted by the router and refused by the worker; max_tokens 0
    the other way round."""
    await harness.serve()
    c = harness.client
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "x", "repeat_penalty": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repeat_penalty"
    assert harness.requests_seen("a") == []
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 0, "echo": True})
    assert r.status_code == 200, r.text  # the worker takes 0 (echo only), so the router does
    assert wire.invalid_field(wire.SamplingParams(max_tokens=0)) is None
    assert wire.invalid_field(wire.SamplingParams(repeat_penalty=0.0)) is not None


async def test_a_request_that_cannot_be_encoded_takes_no_slot(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "n_parallel": 1}})
    plane = harness.plane
    await harness.client.post("/models/load", json={"model": "a"})
    bad = wire.GenerateRequest(id="x", prompt="x", params=wire.SamplingParams(max_tokens=BIG))
    with pytest.raises(InvalidRequest):
        await plane.generate(plane.pool("a"), bad, None)
    assert plane.pools["a"].inflight == 0


async def test_a_failed_send_gives_the_slot_back(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "n_parallel": 1}})
    plane = harness.plane
    await harness.client.post("/models/load", json={"model": "a"})
    inst = plane.pools["a"].instances[0]

    def broken(*args: object) -> bool:
        raise OSError("write failed")

    monkeypatch.setattr(inst, "submit", broken)
    with pytest.raises(OSError):
        await plane.generate(plane.pool("a"), wire.GenerateRequest(id="y", prompt="x"), None)
    assert plane.pools["a"].inflight == 0
    monkeypatch.undo()
    r = await harness.client.post("/v1/completions", json={"model": "a", "prompt": "x"})
    assert r.status_code == 200
