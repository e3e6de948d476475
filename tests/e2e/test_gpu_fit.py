"""n_gpu_layers = "auto" and devices = [...] with a fake device inventory (the worker's test
hook CORRAL_FAKE_DEVICES): real workers, the real model, the plan shown in GET /models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
GiB = 1024 * MiB


def fake(monkeypatch: pytest.MonkeyPatch, *free: int) -> None:
    monkeypatch.setenv("CORRAL_FAKE_DEVICES", json.dumps(
        [{"name": f"CUDA{i}", "backend": "CUDA", "free_bytes": f, "total_bytes": 80 * GiB} for i, f in enumerate(free)]))


async def instance(harness: Harness, model: str) -> dict:  # type: ignore[type-arg]
    r = await harness.client.post("/models/load", json={"model": model})  # type: ignore[union-attr]
    assert r.status_code == 200, r.text
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    entry = next(m for m in r.json()["data"] if m["id"] == model)
    return entry["instances"][0]  # type: ignore[no-any-return]


async def test_auto_fits_the_context_to_a_small_device_and_pins_devices(
        harness: Harness, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, 80 * GiB, 520 * MiB)
    cfg = harness.config({
        "roomy": {"path": str(model_path), "ctx_len": 8192, "n_parallel": 2, "threads": 1},
        "tight": {"path": str(model_path), "ctx_len": 32768, "n_parallel": 2, "threads": 1, "devices": [1],
                  "fit_ctx_floor": 512},
    }, worker_command=None, max_loaded_models=2)
    await harness.start(cfg)

    roomy = await instance(harness, "roomy")
    assert roomy["gpu"]["devices"] == [0]  # placed on the GPU with the most free budget ...
    assert [d["name"] for d in roomy["devices"]] == ["CUDA0"]  # ... and pinned there
    assert roomy["fit"]["device"] == "CUDA0" and roomy["fit"]["ctx_len"] == 8192
    assert roomy["gpu_layers"] == roomy["fit"]["n_layers"] == 19  # 18 layers + the output head

    tight = await instance(harness, "tight")
    assert [d["name"] for d in tight["devices"]] == ["CUDA1"]  # CUDA_VISIBLE_DEVICES=1
    assert tight["gpu"]["devices"] == [1]
    fit = tight["fit"]
    assert fit["device"] == "CUDA1" and fit["ctx_len_asked"] == 32768
    assert fit["ctx_len"] < 32768 or fit["n_gpu_layers"] < fit["n_layers"]
    assert fit["device_bytes"] <= 520 * MiB - fit["margin_bytes"]
    assert tight["gpu_layers"] == fit["n_gpu_layers"]
    # where the parts went, by device: the plan's numbers, split into layers, KV and compute
    *gpu, host = tight["placement"]
    assert [p["device"] for p in gpu] == (["CUDA1"] if fit["n_gpu_layers"] else []) and host["device"] == "CPU"
    assert sum(p["weight_bytes"] + p["kv_bytes"] + p["compute_bytes"] for p in gpu) == fit["device_bytes"]
    assert host["weight_bytes"] + host["kv_bytes"] == fit["host_bytes"] and host["compute_bytes"] == 0
    assert sum(p["layers"] for p in tight["placement"]) == 18 and sum(p["output"] for p in tight["placement"]) == 1
    *gpu, roomy_host = roomy["placement"]
    assert [(p["device"], p["first_layer"], p["layers"], p["output"]) for p in gpu] == [("CUDA0", 0, 18, True)]
    assert (roomy_host["layers"], roomy_host["first_layer"], roomy_host["output"], roomy_host["kv_bytes"]) == (
        0, -1, False, 0)
    assert roomy_host["weight_bytes"] == roomy_host["input_bytes"] > 100 * MiB  # the token embeddings
    # Ollama clients see the split (`ollama ps` prints its CPU/GPU percentages from these)
    r = await harness.client.get("/api/ps")  # type: ignore[union-attr]
    ps = {m["name"]: m for m in r.json()["models"]}
    assert ps["tight"]["size_vram"] == fit["device_bytes"]
    assert ps["tight"]["size"] == fit["device_bytes"] + fit["host_bytes"] - host["input_bytes"]
    assert ps["roomy"]["size_vram"] == ps["roomy"]["size"] == roomy["fit"]["device_bytes"]  # 100% GPU

    r = await harness.client.post("/v1/completions", json={  # type: ignore[union-attr]
        "model": "tight", "prompt": "One, two,", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


async def test_no_gpu_means_no_plan_and_no_layers(harness: Harness, model_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_FAKE_DEVICES", raising=False)
    cfg = harness.config({"m": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 1, "threads": 1}},
                         worker_command=None)
    await harness.start(cfg)
    inst = await instance(harness, "m")
    assert inst["fit"] is None and inst["gpu_layers"] == 0 and inst["gpu"] is None
    assert [d["kind"] for d in inst["devices"]] == ["cpu"]
    [host] = inst["placement"]
    assert (host["device"], host["first_layer"], host["layers"], host["output"]) == ("CPU", 0, 18, True)
    r = await harness.client.get("/api/ps")  # type: ignore[union-attr]
    [ps] = r.json()["models"]
    assert ps["size_vram"] == 0 and ps["size"] == host["weight_bytes"] - host["input_bytes"] + host["kv_bytes"]


async def test_an_unset_context_is_fitted_to_the_host_without_a_gpu(harness: Harness, model_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded model with ``ctx_len`` unset (32,768 cells a slot, its n_ctx_train) on a
    host with no GPU and, as the test inventory says, 600 MiB available: the context comes
    down in 256-cell steps until weights and KV fit in 300 MiB, and GET /models shows it."""
    from corral import wire
    from corral.fit.layout import read_layout
    from corral.model.settings import DEFAULT_SLOT_CTX
    from corral.worker.fit import fit_host_ctx

    layout = read_layout(model_path)
    assert layout.n_ctx_train == DEFAULT_SLOT_CTX  # Gemma 3 270M: the cap is the default
    available = 600 * MiB
    monkeypatch.setenv("CORRAL_FAKE_DEVICES", json.dumps(
        [{"name": "CPU", "backend": "CPU", "kind": "cpu", "free_bytes": available, "total_bytes": 8 * GiB}]))
    want = fit_host_ctx(wire.WorkerSettings(model_id="m", model_path=str(model_path), n_parallel=1), layout, available)
    assert 1024 < want < DEFAULT_SLOT_CTX and want % 256 == 0
    cfg = harness.config({"m": {"path": str(model_path), "ctx_len": 0, "n_parallel": 1, "threads": 1}},
                         worker_command=None)
    await harness.start(cfg)
    inst = await instance(harness, "m")
    assert inst["n_ctx_slot"] == want and inst["fit"] is None and inst["gpu_layers"] == 0
    [host] = inst["placement"]
    assert host["weight_bytes"] + host["kv_bytes"] <= available // 2
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    entry = next(m for m in r.json()["data"] if m["id"] == "m")
    assert entry["settings"]["ctx_len"] == DEFAULT_SLOT_CTX  # what was asked: unset, 32,768 a slot
    r = await harness.client.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 2})  # type: ignore[union-attr]
    assert r.status_code == 200, r.text


async def test_two_models_spread_over_two_gpus_and_a_third_evicts_the_lru_one(
        harness: Harness, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.fit.layout import read_layout
    from corral.fit.plan import device_need
    from corral.model.settings import ModelSettings

    settings = {"ctx_len": 2048, "n_parallel": 1, "threads": 1}
    need = device_need(read_layout(model_path), ModelSettings(**settings), budget_bytes=80 * GiB)
    room = need + need // 2  # one model per GPU
    fake(monkeypatch, room + 10 * MiB, room)
    cfg = harness.config({m: {"path": str(model_path), "own_instances": True, **settings} for m in ("a", "b", "c")},
                         worker_command=None, gpu_memory_margin=0)
    plane = await harness.start(cfg)

    a = await instance(harness, "a")
    b = await instance(harness, "b")
    assert (a["gpu"]["devices"], b["gpu"]["devices"]) == ([0], [1])
    assert a["fit"]["device"] == "CUDA0" and b["fit"]["device"] == "CUDA1"
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    gpus = r.json()["gpus"]
    assert [g["used_bytes"] for g in gpus] == [a["fit"]["device_bytes"], b["fit"]["device_bytes"]]
    assert 0 < a["fit"]["device_bytes"] <= need  # the worker's plan, the router's estimate: same math

    r = await harness.client.post("/v1/completions", json={  # type: ignore[union-attr]
        "model": "c", "prompt": "One, two,", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200
    assert not plane.pools["a"].occupies and plane.pools["b"].occupies  # a: least recently used
    c = await instance(harness, "c")
    assert c["gpu"]["devices"] == [0] and c["fit"]["device"] == "CUDA0"


async def test_auto_over_two_gpus_plans_more_and_charges_both(
        harness: Harness, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 350 MiB GPUs: one alone holds all 19 layers only with 7680 cells of context (the
    head, a copy of Gemma's 170 MiB token embeddings, takes half of it); pinned to both, the
    layers split over them (by free memory, as llama.cpp splits) and the context is the
    32768 asked for. GET /models charges each GPU its share."""
    fake(monkeypatch, 350 * MiB, 350 * MiB)
    settings = {"path": str(model_path), "ctx_len": 32768, "n_parallel": 2, "threads": 1, "fit_ctx_floor": 512}
    cfg = harness.config({"two": {**settings, "devices": [0, 1]}, "one": {**settings, "devices": [0]}},
                         worker_command=None, gpu_memory_margin=0, max_loaded_models=1)
    await harness.start(cfg)

    two = await instance(harness, "two")
    fit = two["fit"]
    assert [d["name"] for d in two["devices"]] == ["CUDA0", "CUDA1"] and fit["device"] == "CUDA0,CUDA1"
    assert [(d["index"], d["name"]) for d in fit["devices"]] == [(0, "CUDA0"), (1, "CUDA1")]
    assert all(0 < d["bytes"] <= 350 * MiB for d in fit["devices"])
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    used = [g["used_bytes"] for g in r.json()["gpus"]]
    assert used == [d["bytes"] for d in fit["devices"]] and sum(used) == fit["device_bytes"]
    assert two["gpu"]["need_bytes_per_device"] == used  # the router's estimate: the worker's math
    r = await harness.client.post("/v1/completions", json={  # type: ignore[union-attr]
        "model": "two", "prompt": "One, two,", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200

    one = await instance(harness, "one")  # evicts "two" (max_loaded_models = 1)
    assert one["fit"]["device"] == "CUDA0" and one["fit"]["devices"] == []
    assert (one["fit"]["n_gpu_layers"], one["fit"]["ctx_len"]) == (19, 7680)
    assert (fit["n_gpu_layers"], fit["ctx_len"]) == (19, 32768)  # more context on two
    assert two["gpu_layers"] == 19 and one["gpu_layers"] == 19
