"""One model at a time with a time slice (model_time_slice_s): no swap per request within
a slice, and a busy model yields to a waiting one after it (fake workers)."""

from __future__ import annotations

import asyncio

from support.harness import Harness, _until


def _models(harness: Harness) -> dict[str, dict[str, object]]:
    return {m: {"path": str(harness.script(m, slow_delay_s=0.1)), "n_parallel": 1} for m in ("a", "b")}


async def test_an_idle_model_keeps_its_place_within_its_slice(harness: Harness) -> None:
    cfg = harness.config(_models(harness), max_loaded_models=1, model_time_slice_s=3.0)
    plane = await harness.start(cfg)
    c = harness.client
    assert (await c.post("/v1/completions", json={"model": "a", "prompt": "a1"})).status_code == 200
    b = asyncio.create_task(c.post("/v1/completions", json={"model": "b", "prompt": "b1"}))
    # a is idle, but within its slice: b waits for room (no slice: it evicts a at once) ...
    await _until(lambda: plane.admission.waits_for_room or plane.pools["b"].occupies)
    # ... and a's next request needs no swap
    assert (await c.post("/v1/completions", json={"model": "a", "prompt": "a2"})).status_code == 200
    assert not b.done() and plane.pools["a"].loads == 1 and not plane.pools["b"].occupies
    assert (await b).status_code == 200  # the slice ended: a (idle) was evicted
    assert plane.pools["a"].loads == 1 and not plane.pools["a"].occupies


async def test_a_busy_model_yields_after_its_slice(harness: Harness) -> None:
    cfg = harness.config(_models(harness), max_loaded_models=1, model_time_slice_s=0.3)
    plane = await harness.start(cfg)
    c = harness.client
    assert (await c.post("/v1/completions", json={"model": "a", "prompt": "warm"})).status_code == 200
    finished: list[str] = []

    async def post(model: str, prompt: str) -> int:
        r = await c.post("/v1/completions", json={"model": model, "prompt": prompt})
        finished.append(prompt)
        return r.status_code

    a_tasks = [asyncio.create_task(post("a", f"SLOW a{i}")) for i in range(8)]  # ~0.4 s each, one slot
    await _until(lambda: len(plane.pools["a"].waiters) == 7)
    b = asyncio.create_task(post("b", "b1"))
    assert await b == 200
    assert all(s == 200 for s in await asyncio.gather(*a_tasks))
    # without a slice b would wait until all of a's queue was done; here a yielded, drained
    # (its running request finished), b ran, then a loaded again for the rest
    assert finished.index("b1") < len(finished) - 1, finished
    assert plane.pools["a"].loads == 2 and plane.pools["b"].loads == 1
