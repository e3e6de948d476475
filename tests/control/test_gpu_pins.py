"""What GPU numbers mean, and the settings that name GPUs: the server's own
``CUDA_VISIBLE_DEVICES`` (GPU k is the k-th GPU the server sees), ``devices`` naming a
GPU the server does not see, and ``tensor_split`` (checked with ``devices`` when the
config is read, and the split the worker is given). Fake workers and the fake device
inventory of test_gpu_placement.py (the fake hook honours ``CUDA_VISIBLE_DEVICES`` as
CUDA does: it hides the GPUs it does not list and orders the rest as listed)."""

from __future__ import annotations

import json

import pytest

from corral.config.file import config_from_dict
from corral.errors import ConfigError
from corral.model.settings import ModelSettings
from support.harness import Harness
from control.test_gpu_placement import config, fake_gpus, gpus_of, load, model


def test_gpu_numbers_pick_from_the_servers_own_visible_devices() -> None:
    s = ModelSettings(devices=[1, 0])
    assert s.device_env({}) == {"CUDA_VISIBLE_DEVICES": "1,0", "HIP_VISIBLE_DEVICES": "1,0",
                                "GGML_VK_VISIBLE_DEVICES": "1,0"}
    # the variables the server sets are mapped; the others stay unset (ROCm honours both
    # HIP's and CUDA's: a raw number there would pick the machine's GPU again)
    assert s.device_env({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb", "GGML_VK_VISIBLE_DEVICES": "3,5,7"}) == {
        "CUDA_VISIBLE_DEVICES": "GPU-bb,GPU-aa", "GGML_VK_VISIBLE_DEVICES": "5,3"}
    assert ModelSettings(devices=[0, 2]).device_env({"CUDA_VISIBLE_DEVICES": "4,6"})["CUDA_VISIBLE_DEVICES"] == "4"
    assert s.device_env({"CUDA_VISIBLE_DEVICES": ""}) == {"CUDA_VISIBLE_DEVICES": ""}  # the server sees no GPU
    assert s.device_env({"PATH": "/bin"}) == s.device_env({})
    assert ModelSettings().device_env({"CUDA_VISIBLE_DEVICES": "4,6"}) == {}  # unpinned: inherits the server's


async def test_a_server_started_on_some_gpus_places_workers_on_those(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CUDA_VISIBLE_DEVICES=2,1 corral serve``: the server's GPU 0 is the machine's GPU 2,
    so a worker placed on GPU 0 must see GPU 2, not the machine's GPU 0."""
    fake_gpus(monkeypatch, 10000, 20000, 30000)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    models = {"a": model(harness, "a", 6000), "b": model(harness, "b", 6000, devices=[1])}
    await harness.start(config(harness, models))
    await load(harness, "a", "b")
    placed, gpus = await gpus_of(harness)
    assert [(g["name"], g["budget_bytes"]) for g in gpus] == [("CUDA2", 30000), ("CUDA1", 20000)]
    assert placed == {"a": [[0]], "b": [[1]]}
    r = await harness.client.get("/models")  # type: ignore[union-attr]
    seen = {m["id"]: [d["name"] for d in m["instances"][0]["devices"]] for m in r.json()["data"]}
    assert seen == {"a": ["CUDA2", "CPU"], "b": ["CUDA1", "CPU"]}


async def test_a_pin_to_a_gpu_the_server_does_not_see_is_refused(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 10000)
    models = {"far": model(harness, "far", 3000, devices=[0, 3]), "ok": model(harness, "ok", 3000, devices=[1])}
    plane = await harness.start(config(harness, models))
    c = harness.client
    for r in (await c.post("/models/load", json={"model": "far"}),
              await c.post("/v1/completions", json={"model": "far", "prompt": "x"})):
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
        msg = r.json()["error"]["message"]
        assert "'far' is pinned to GPU 3 (devices = [0, 3])" in msg
        assert "this server sees 2 GPU(s): 0 (CUDA0), 1 (CUDA1)" in msg
    assert not plane.pools["far"].occupies
    await load(harness, "ok")  # others are unaffected
    _, gpus = await gpus_of(harness)
    assert [g["used_bytes"] for g in gpus] == [0, 3000]


@pytest.mark.parametrize(("settings", "why"), [
    ({"devices": [0, 1], "tensor_split": [1.0]}, "[models.m] key 'tensor_split': [1.0] needs one proportion per "
                                                 "GPU of devices, not all 0 (the model has devices = [0, 1])"),
    ({"tensor_split": [1.0, 1.0]}, "(the model has no devices)"),
    ({"devices": [0, 1], "tensor_split": [0, 0]}, "[0.0, 0.0] needs one proportion per GPU of devices, not all 0"),
])
def test_a_tensor_split_that_does_not_match_devices_is_a_config_error(
        harness: Harness, settings: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError) as ei:
        harness.config({"m": model(harness, "m", 3000, **settings)})
    assert why in str(ei.value)
    with pytest.raises(ConfigError, match=r"\[defaults\] key 'tensor_split': \[2.0, 1.0\] needs one proportion"):
        config_from_dict({"defaults": {"tensor_split": [2, 1]}})  # the models not in the file inherit it
    assert config_from_dict({"defaults": {"tensor_split": [2, 1], "devices": [0, 1]}})


async def test_tensor_split_apportions_the_estimate_and_reaches_the_worker(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpus(monkeypatch, 10000, 30000)
    models = {"even": model(harness, "even", 8000, devices=[0, 1], tensor_split=[1, 1])}
    await harness.start(config(harness, models))
    await load(harness, "even")
    _, gpus = await gpus_of(harness)
    assert [g["used_bytes"] for g in gpus] == [4000, 4000]  # by free memory it would be 2000 and 6000
    sent = json.loads((harness.tmp / "even.json.settings").read_text())
    assert sent["tensor_split"] == [1.0, 1.0] and sent["devices"] == [0, 1]
