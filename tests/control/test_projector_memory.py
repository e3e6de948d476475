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
