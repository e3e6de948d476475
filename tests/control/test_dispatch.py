"""The request path for a pool resolved once (control/dispatch.py): a request that waited
notices on its handle that its model went away meanwhile, and gets the 404 of a removed
model, not a request to a model the name no longer names. Fake workers (router logic)."""

from __future__ import annotations

import asyncio

import pytest

from corral import wire
from corral.errors import ModelNotFound
from support.harness import Harness, chat
from support.harness import _until


async def test_a_request_queued_when_its_model_is_removed_gets_404(harness: Harness) -> None:
    await harness.serve({"b": {"path": str(harness.script("b", slow_delay_s=0.05)),
                               "n_parallel": 1}})
    plane = harness.plane
    cl = harness.client
    running = asyncio.create_task(cl.post("/v1/chat/completions", json=chat("b", "SLOW")))
    await _until(lambda: plane.pools["b"].inflight == 1)
    queued = asyncio.create_task(cl.post("/v1/chat/completions", json=chat("b")))
    await _until(lambda: len(plane.pools["b"].waiters) == 1)
    await plane.remove_model("b")
    r = await queued
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert (await running).status_code == 200  # the running one finished (removal drains)
    assert (await cl.post("/v1/chat/completions", json=chat("b"))).status_code == 404


async def test_a_handle_to_a_removed_model_is_not_the_model_added_again_under_its_id(harness: Harness) -> None:
    await harness.serve({"b": {"path": str(harness.script("b"))}})
    plane = harness.plane
    old = plane.pool("b")
    spec = old.spec
    await plane.remove_model("b")
    await plane.add_model(spec)
    assert plane.pool("b") is not old
    with pytest.raises(ModelNotFound, match="was removed"):
        await plane.generate(old, wire.GenerateRequest(id="x", prompt="hi"), None)
    stream = await plane.generate(plane.pool("b"), wire.GenerateRequest(id="y", prompt="hi"), None)
    await stream.wait_done()
    assert stream.finished is not None


async def test_a_name_that_names_nothing_is_counted_once_as_unknown(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "aliases": ["first"]}})
    plane = harness.plane
    cl = harness.client
    for path, body in [("/v1/chat/completions", chat("nope")), ("/api/chat", chat("nope")),
                       ("/v1/embeddings", {"model": "nope", "input": "x"})]:
        assert (await cl.post(path, json=body)).status_code == 404, path
    assert (await cl.post("/v1/chat/completions", json=chat("first"))).status_code == 200  # an alias
    counted = {(s.labels["model"], s.labels["endpoint"]): s.value for metric in plane.metrics.registry.collect()
               if metric.name == "corral_requests" for s in metric.samples if s.name == "corral_requests_total"}
    assert counted == {("unknown", "chat"): 1, ("unknown", "ollama_chat"): 1, ("unknown", "embeddings"): 1,
                       ("a", "chat"): 1}
