"""One model at a time: which waiting model loads next is decided over the keys' shares
(control/scheduling/load_gate.py), not by who asked first (fake workers)."""

from __future__ import annotations

import asyncio
from typing import Any

from support.harness import Harness, _until
from support.keys import bearer, write_keys_file


def _models(harness: Harness) -> dict[str, dict[str, Any]]:
    return {m: {"path": str(harness.script(m, slow_delay_s=0.15)), "n_parallel": 1} for m in "abcd"}


async def _order(harness: Harness, keyed: bool) -> list[str]:
    path = harness.tmp / "keys.toml"
    secrets = write_keys_file(path, heavy={}, light={}) if keyed else {}
    server: dict[str, Any] = {"max_loaded_models": 1}
    if keyed:
        server["keys_file"] = str(path)
    await harness.serve(_models(harness), **server)
    plane = harness.plane
    c = harness.client
    heavy = bearer(secrets["heavy"]) if keyed else {}
    light = bearer(secrets["light"]) if keyed else {}
    gate = plane.admission._lock

    def post(model: str, headers: dict[str, str]) -> asyncio.Task[Any]:
        return asyncio.create_task(c.post("/v1/completions", headers=headers,
                                          json={"model": model, "prompt": f"SLOW {model}"}))

    a = post("a", heavy)  # a loads and runs (0.6 s)
    await _until(lambda: plane.pools["a"].inflight == 1)
    tasks = [post("c", heavy)]  # holds the gate, waiting for a to end
    await _until(lambda: plane.admission.waits_for_room)
    tasks.append(post("d", heavy))
    await _until(lambda: gate.waiting == 1)
    tasks.append(post("b", light))  # asks last
    await _until(lambda: gate.waiting == 2)
    assert all(r.status_code == 200 for r in await asyncio.gather(a, *tasks))
    return sorted("abcd", key=lambda m: plane.pools[m].loaded_at)


async def test_the_key_below_its_share_loads_next(harness: Harness) -> None:
    # after c (heavy) loaded: heavy had two turns, light none: light's b before heavy's d
    assert await _order(harness, keyed=True) == ["a", "c", "b", "d"]


async def test_without_keys_loads_go_in_order(harness: Harness) -> None:
    assert await _order(harness, keyed=False) == ["a", "c", "d", "b"]
