"""A model's vision projector counts in its memory: the host estimate before it loads,
and its GPU need (on its first GPU, where llama.cpp puts the projector), so admission
places it where both fit and refuses it where they never could. Fake workers and a fake
device inventory, as in test_gpu_placement.py (a fake model's need is its file size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.control.placement.memory import instance_estimate
from support.harness import Harness

from corral.control.placement.gpus import device_use

from .test_gpu_placement import config, fake_gpus, model


def projector(harness: Harness, name: str, size: int) -> str:
    d = harness.tmp / "projectors"
    d.mkdir(exist_ok=True)
    p: Path = d / f"mmproj-{name}.gguf"
    p.write_bytes(b"GGUF" + bytes(size - 4))
    return str(p)


async def test_projector_bytes_count_in_the_estimate_and_the_gpu_need(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000)
    models = {"plain": model(harness, "plain", 6000),
              "seeing": model(harness, "seeing", 6000, mmproj=projector(harness, "seeing", 3000)),
              "toobig": model(harness, "toobig", 6000, mmproj=projector(harness, "toobig", 5000))}
    plane = await harness.start(config(harness, models))
    c = harness.client
    assert instance_estimate(plane.pools["plain"]) == 6000
    assert instance_estimate(plane.pools["seeing"]) == 9000
    r = await c.post("/models/load", json={"model": "seeing"})
    assert r.status_code == 200, r.text
    (inst,) = next(m for m in (await c.get("/models")).json()["data"] if m["id"] == "seeing")["instances"]
    assert inst["gpu"]["need_bytes"] == 9000 and inst["gpu"]["devices"] == [0]
    # the worker plans its layers in what the projector leaves of its budget
    sent = json.loads((harness.tmp / "seeing.json.settings").read_text())
    assert sent["gpu_budget_bytes"] == [10000 - 3000] and sent["mmproj"].endswith("mmproj-seeing.gguf")
    # 6000 of weights and 5000 of projector never fit a 10000-byte GPU: refused, saying so
    r = await c.post("/models/load", json={"model": "toobig"})
    assert r.status_code >= 400 and "needs about" in r.text, r.text
    r = await c.post("/models/unload", json={"model": "seeing"})
    assert r.status_code == 200
    r = await c.post("/models/load", json={"model": "plain"})
    assert r.status_code == 200
    (inst,) = next(m for m in (await c.get("/models")).json()["data"] if m["id"] == "plain")["instances"]
    assert inst["gpu"]["need_bytes"] == 6000


async def test_what_sits_beside_the_layers_still_counts_once_the_plan_is_reported(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's fit plan covers its layers only: the projector and the LoRA adapters (on
    its first GPU) still count after it is reported, so a model that fits beside the plan
    alone but not beside the plan and them evicts it."""
    fake_gpus(monkeypatch, 10000)
    lora = harness.tmp / "adapter.gguf"
    lora.write_bytes(b"GGUF" + bytes(996))
    models = {"seeing": model(harness, "seeing", 6000, device_bytes=3000, mmproj=projector(harness, "seeing", 2000)),
              "adapted": model(harness, "adapted", 6000, device_bytes=3000, lora=[{"id": "a", "path": str(lora)}]),
              "plain": model(harness, "plain", 5500)}
    plane = await harness.start(config(harness, models))
    c = harness.client
    for name, beside in (("seeing", 2000), ("adapted", 1000)):
        r = await c.post("/models/load", json={"model": name})
        assert r.status_code == 200, r.text
        gpu = plane.pools[name].instances[0].gpu
        assert gpu is not None and gpu.needs == [6000 + beside]  # the estimate it was placed with
        assert device_use(plane.pools[name]) == {0: 3000 + beside}  # its plan, and its projector or adapter
        sent = json.loads((harness.tmp / f"{name}.json.settings").read_text())
        assert sent["gpu_budget_bytes"] == [10000 - beside]  # the worker plans its layers in the rest
        # 5500 fits beside 3000 + 1000 in 10000, not beside 3000 + 2000
        r = await c.post("/models/load", json={"model": "plain"})
        assert r.status_code == 200, r.text
        assert plane.pools[name].occupies == (name == "adapted"), name
        r = await c.post("/models/unload", json={"model": "plain"})
        assert r.status_code == 200
        if plane.pools[name].occupies:
            assert (await c.post("/models/unload", json={"model": name})).status_code == 200
