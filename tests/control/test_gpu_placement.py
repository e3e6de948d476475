"""GPU placement and the per-device budget, with fake workers and a fake device inventory
(the worker's test hook CORRAL_FAKE_DEVICES, which the fake worker's ``--list-devices``
and Ready report too). A fake model's estimated GPU need is its file size (it is not
GGUF); ``device_bytes`` in its script makes it report a fit plan with that many bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.control.placement.gpus import device_use
from support.harness import Harness, wait_event
from support.harness import _until


def fake_gpus(monkeypatch: pytest.MonkeyPatch, *free: int) -> None:
    monkeypatch.setenv("CORRAL_FAKE_DEVICES", json.dumps(
        [{"name": f"CUDA{i}", "backend": "CUDA", "free_bytes": f, "total_bytes": 2 * f} for i, f in enumerate(free)]
        + [{"name": "CPU", "backend": "CPU", "kind": "cpu", "free_bytes": 1, "total_bytes": 1}]))


def model(harness: Harness, name: str, size: int, **settings: Any) -> dict[str, Any]:
    """A fake model whose file is ``size`` bytes (its estimated GPU need)."""
    script = {k: settings.pop(k) for k in ("device_bytes",) if k in settings}
    p: Path = harness.script(name, **script)
    text = p.read_text()
    assert len(text) <= size
    p.write_text(text + " " * (size - len(text)))
    return {"path": str(p), **settings}


async def load(harness: Harness, *names: str) -> None:
    for name in names:
        r = await harness.client.post("/models/load", json={"model": name})  # type: ignore[union-attr]
        assert r.status_code == 200, r.text


def config(harness: Harness, models: dict[str, dict[str, Any]], **server: Any) -> Any:
    return harness.config(models, gpu_memory_margin=0, **server)


async def gpus_of(harness: Harness) -> tuple[dict[str, list[Any]], list[dict[str, Any]]]:
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    body = r.json()
    placed = {m["id"]: [i["gpu"]["devices"] if i["gpu"] else None for i in m["instances"]] for m in body["data"]}
    return placed, body["gpus"]


async def test_models_spread_over_gpus_and_a_third_evicts_the_lru_by_memory(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 8000)
    models = {"a": model(harness, "a", 6000), "b": model(harness, "b", 6000), "c": model(harness, "c", 5000)}
    plane = await harness.start(config(harness, models))
    c = harness.client
    await load(harness, "a", "b")
    placed, gpus = await gpus_of(harness)
    assert placed["a"] == [[0]] and placed["b"] == [[1]]  # most free budget first
    assert [(g["name"], g["budget_bytes"], g["used_bytes"]) for g in gpus] == [("CUDA0", 10000, 6000),
                                                                                ("CUDA1", 8000, 6000)]
    r = await c.get("/models")
    a = next(m for m in r.json()["data"] if m["id"] == "a")["instances"][0]
    assert [d["name"] for d in a["devices"]] == ["CUDA0", "CPU"]  # the worker saw only its GPU

    async with plane.bus.subscribe() as q:
        await load(harness, "c")
        ev = await wait_event(q, lambda e: e.get("new") == "stopped")
    assert ev["model"] == "a" and "evicted to make room for c" in ev["reason"] and "GPU 0 (CUDA0)" in ev["reason"]
    placed, gpus = await gpus_of(harness)
    assert placed["c"] == [[0]] and placed["b"] == [[1]]
    assert {m for m, p in plane.pools.items() if p.occupies} == {"b", "c"}  # by memory, not by a count


async def test_a_busy_model_is_never_evicted_the_load_waits_then_503(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000)
    models = {"a": model(harness, "a", 6000), "b": model(harness, "b", 6000)}
    plane = await harness.start(config(harness, models, queue_timeout_s=0.3))
    c = harness.client
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)
        r = await c.post("/v1/completions", json={"model": "b", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_timeout"
        msg = r.json()["error"]["message"]
        assert "GPU 0 (CUDA0) has 3.9 KiB free of its budget 9.8 KiB, the model needs 5.9 KiB" in msg
        assert plane.pools["a"].has_ready and not plane.pools["b"].occupies
    # idle now: the same load evicts it
    await load(harness, "b")
    assert not plane.pools["a"].occupies


async def test_the_reported_fit_plan_replaces_the_estimate(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000)
    models = {"a": model(harness, "a", 6000, device_bytes=3000), "b": model(harness, "b", 6000)}
    plane = await harness.start(config(harness, models))
    c = harness.client
    await load(harness, "a")
    assert device_use(plane.pools["a"]) == {0: 3000}  # the plan, not the 6000 estimated
    await load(harness, "b")
    assert plane.pools["a"].occupies and plane.pools["b"].occupies  # 3000 + 6000 fit in 10000
    r = await c.get("/models")
    a = next(m for m in r.json()["data"] if m["id"] == "a")["instances"][0]
    assert a["fit"]["device_bytes"] == 3000 and a["fit"]["device"] == "CUDA0"


async def test_pinned_devices_are_respected_and_instances_spread(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 10000)
    models = {"pinned": model(harness, "pinned", 3000, devices=[1]),
              "two": model(harness, "two", 3000, instances=2),
              "big": model(harness, "big", 6000, devices=[1])}
    plane = await harness.start(config(harness, models))
    c = harness.client
    await load(harness, "two", "pinned")
    assert (await c.post("/v1/completions", json={"model": "two", "prompt": "x"})).status_code == 200
    placed, gpus = await gpus_of(harness)
    assert placed["pinned"] == [[1]]
    assert sorted(placed["two"]) == [[0], [1]]  # one instance on each GPU
    assert [g["used_bytes"] for g in gpus] == [3000, 6000]
    r = await c.get("/models")
    pinned = next(m for m in r.json()["data"] if m["id"] == "pinned")["instances"][0]
    assert [d["name"] for d in pinned["devices"]] == ["CUDA1", "CPU"]
    # big is pinned to GPU 1 (4000 free): the LRU idle model there goes, though GPU 0 has room
    async with plane.bus.subscribe() as q:
        await load(harness, "big")
        ev = await wait_event(q, lambda e: e.get("new") == "stopped")
    assert ev["model"] == "pinned"
    placed, _ = await gpus_of(harness)
    assert placed["big"] == [[1]] and plane.pools["two"].occupies


async def test_a_model_that_can_never_fit_fails_with_the_reason(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000)
    models = {"huge": model(harness, "huge", 20000, n_gpu_layers=-1)}
    await harness.start(config(harness, models, gpu_memory_budget=[9000]))
    r = await harness.client.post("/models/load", json={"model": "huge"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
    msg = r.json()["error"]["message"]
    assert "needs about" in msg and "the largest GPU (n_gpu_layers" in msg and "has a budget of 8.8 KiB" in msg  # 9000 B: the cap


async def test_no_gpu_or_no_gpu_layers_means_no_placement(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000)
    models = {"cpu": model(harness, "cpu", 9000, n_gpu_layers=0), "gpu": model(harness, "gpu", 9000)}
    plane = await harness.start(config(harness, models))
    await load(harness, "cpu", "gpu")
    placed, _ = await gpus_of(harness)
    assert placed == {"cpu": [None], "gpu": [[0]]}
    assert plane.pools["cpu"].occupies  # it takes no GPU memory: nothing evicted


async def test_without_gpus_everything_is_as_before(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_FAKE_DEVICES", raising=False)
    models = {"a": model(harness, "a", 6000), "b": model(harness, "b", 6000)}
    await harness.start(config(harness, models))
    await load(harness, "a", "b")
    placed, gpus = await gpus_of(harness)
    assert placed == {"a": [None], "b": [None]} and gpus == []


async def test_gpus_are_learnt_from_a_worker_report_when_the_probe_saw_none(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10001, 8001)  # free bytes no other test uses: a probe of its own
    monkeypatch.setenv("FAKE_PROBE_SEES_NOTHING", "1")
    models = {"a": model(harness, "a", 6000, device_bytes=6000), "b": model(harness, "b", 6000)}
    await harness.start(config(harness, models))
    await load(harness, "a")
    placed, gpus = await gpus_of(harness)
    assert placed["a"] == [None] and gpus == []  # no GPU known: not placed
    await load(harness, "b")  # a reported CUDA0 and CUDA1, and its plan on CUDA0
    placed, gpus = await gpus_of(harness)
    assert placed["b"] == [[1]] and [g["used_bytes"] for g in gpus] == [6000, 6000]
