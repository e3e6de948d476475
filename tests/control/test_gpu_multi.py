"""A model pinned to several GPUs is charged on each of them with its share, with fake
workers and a fake device inventory (see test_gpu_placement.py). A fake model is not
GGUF: its estimated need is its file size, split over its GPUs by their free memory;
``device_bytes = [...]`` makes it report a plan with that many bytes on each GPU it sees."""

from __future__ import annotations

import json

import pytest

from support.harness import Harness
from control.test_gpu_placement import config, fake_gpus, gpus_of, load, model
from support.harness import _until


async def test_a_model_pinned_to_two_gpus_is_charged_on_both(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 30000)
    models = {"est": model(harness, "est", 8000, devices=[0, 1]),
              "plan": model(harness, "plan", 6000, devices=[0, 1], device_bytes=[2500, 3500])}
    plane = await harness.start(config(harness, models))
    await load(harness, "est")
    placed, gpus = await gpus_of(harness)
    assert placed["est"] == [[0, 1]]
    assert [g["used_bytes"] for g in gpus] == [2000, 6000]  # the estimate, split 1:3 by free memory
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    est = next(m for m in r.json()["data"] if m["id"] == "est")["instances"][0]
    assert est["gpu"] == {"devices": [0, 1], "need_bytes": 8000, "need_bytes_per_device": [2000, 6000]}
    sent = json.loads((harness.tmp / "est.json.settings").read_text())
    assert sent["devices"] == [0, 1] and sent["gpu_budget_bytes"] == [10000, 30000]  # each GPU's free budget

    await plane.admission.unload(plane.pools["est"], "test", drain=False)
    await load(harness, "plan")
    _, gpus = await gpus_of(harness)
    assert [g["used_bytes"] for g in gpus] == [2500, 3500]  # the worker's plan, each GPU its share
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    fit = next(m for m in r.json()["data"] if m["id"] == "plan")["instances"][0]["fit"]
    assert [(d["index"], d["name"], d["bytes"]) for d in fit["devices"]] == [(0, "CUDA0", 2500), (1, "CUDA1", 3500)]
    assert fit["device_bytes"] == sum(g["used_bytes"] for g in gpus) == 6000


async def test_the_share_on_the_second_gpu_keeps_others_off_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 10000)
    models = {"two": model(harness, "two", 6000, devices=[0, 1], device_bytes=[2000, 8000]),
              "one": model(harness, "one", 4000, devices=[1]),
              "pair": model(harness, "pair", 6000, devices=[0, 1]),  # estimate: 3000 on each
              "free": model(harness, "free", 4000)}
    plane = await harness.start(config(harness, models, queue_timeout_s=0.3))
    c = harness.client
    await load(harness, "two")
    async with c.stream("POST", "/v1/completions", json={"model": "two", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["two"].inflight == 1)
        r = await c.post("/v1/completions", json={"model": "one", "prompt": "x"})  # GPU 1 has 2000 left
        assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_timeout"
        assert "GPU 1 (CUDA1) has 2.0 KiB free of its budget 9.8 KiB, the model needs 3.9 KiB" in r.json()["error"]["message"]
        r = await c.post("/v1/completions", json={"model": "pair", "prompt": "x"})  # room on GPU 0, not on 1
        assert r.status_code == 503
        assert "GPU 1 (CUDA1) has 2.0 KiB free of its budget 9.8 KiB, the model needs 2.9 KiB" in r.json()["error"]["message"]
        await load(harness, "free")  # unpinned: to GPU 0, where 8000 are left
        placed, gpus = await gpus_of(harness)
        assert placed["free"] == [[0]] and [g["used_bytes"] for g in gpus] == [6000, 8000]
    # idle now: loading "one" evicts "two" (the LRU model on GPU 1), not "free"
    await load(harness, "one")
    assert not plane.pools["two"].occupies and plane.pools["free"].occupies
    placed, gpus = await gpus_of(harness)
    assert placed["one"] == [[1]] and [g["used_bytes"] for g in gpus] == [4000, 4000]


async def test_the_worker_gets_its_budget_on_each_gpu(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 20000)
    models = {"a": model(harness, "a", 3000, devices=[1]), "two": model(harness, "two", 3000, devices=[0, 1])}
    await harness.start(config(harness, models))
    await load(harness, "a", "two")
    sent = json.loads((harness.tmp / "two.json.settings").read_text())
    assert sent["devices"] == [0, 1] and sent["gpu_budget_bytes"] == [10000, 17000]  # "a" took 3000 of GPU 1
    # and the split its need was estimated with (an "auto" model: by the GPUs' whole budgets)
    assert sent["tensor_split"] == [10000.0, 20000.0]


async def test_a_pinned_gpu_that_can_never_hold_its_share_is_named(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 10000)
    models = {"huge": model(harness, "huge", 20000, n_gpu_layers=-1, devices=[0, 1])}
    await harness.start(config(harness, models, gpu_memory_budget=[9000]))
    r = await harness.client.post("/models/load", json={"model": "huge"})  # type: ignore[union-attr]
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
    msg = r.json()["error"]["message"]
    assert "needs about 9.8 KiB of GPU memory on GPU 0 (CUDA0)" in msg and "has a budget of 8.8 KiB" in msg
