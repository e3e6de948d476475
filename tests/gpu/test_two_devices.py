"""Two devices on one: ``GGML_VK_VISIBLE_DEVICES=0,0`` makes ggml-vulkan open Mesa's lavapipe
twice, as ``Vulkan0`` and ``Vulkan1`` (two VkDevices on the one physical device, each with the
host's memory as its own: measured 2026-12-03, docs/internals/gpu-placement.md), so the router's
multi-GPU paths run on a real backend. On CUDA it needs two GPUs (bench/gpu/run.sh on one
card skips it). ``gpu_memory_budget`` gives each GPU the same cap (the two share one memory, so
the free memory each reports says nothing about the other's).

- Two instances of one unpinned model spread over the two GPUs (one each, each with all its
  layers there), charged on each.
- ``devices = [1]`` pins a model to GPU 1: charged there, nothing on GPU 0, its worker started
  with the second entry of the server's ``GGML_VK_VISIBLE_DEVICES``.
- ``devices = [0, 1]`` with ``tensor_split = [3, 1]``: the layers split as llama.cpp splits
  them (the plan's per-device weights and KV against the buffers llama.cpp logged on
  ``Vulkan0`` and ``Vulkan1``), charged on both, and it decodes the greedy tokens of the
  one-device instances.

Mutations that fail it (by hand, 2026-12-03): ``GpuBudget.place`` putting every unpinned
instance on GPU 0 (spread ``[[0], [0]]``); a pinned model charged on GPU 0 (``[0]``, not ``[1]``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.control.placement.gpus import probe_devices
from corral.fit.layout import read_layout
from corral.fit.plan import device_need
from corral.model.settings import ModelSettings
from support.harness import Harness

from .conftest import BACKEND, DEVICE
from .test_one_device import PROMPT, SETTINGS, MiB, complete, instance, load, view

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]


@pytest.fixture
def two_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    if BACKEND == "vulkan":
        monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0,0")
    elif len([d for d in probe_devices([sys.executable, "-m", "corral.worker"]) if d.kind == "gpu"]) < 2:
        pytest.skip("CUDA: one GPU here, two needed (on lavapipe this never skips)")


async def test_spread_pin_and_split_over_two_devices(two_devices: None, harness: Harness, model_path: Path) -> None:
    layout = read_layout(model_path)
    units = layout.n_layer + 1  # the repeating layers and the head
    need = device_need(layout, ModelSettings(**SETTINGS), budget_bytes=1 << 40)
    budget = 3 * need  # each GPU: room for the spread instance and one more
    models: dict[str, dict[str, Any]] = {
        "spread": {"path": str(model_path), **SETTINGS, "instances": 2},
        "pinned": {"path": str(model_path), **SETTINGS, "devices": [1]},
        "split": {"path": str(model_path), **SETTINGS, "devices": [0, 1], "tensor_split": [3, 1]},
    }
    cfg = harness.config(models, worker_command=None, gpu_memory_margin=0, gpu_memory_budget=[budget, budget],
                         max_loaded_models=3, load_timeout_s=1800, queue_timeout_s=5)
    plane = await harness.start(cfg)
    names = [f"{DEVICE}0", f"{DEVICE}1"]

    # spread: one instance on each GPU, each with every unit there
    state = await load_all(harness, plane, "spread")
    assert [g["name"] for g in state["gpus"]] == names
    spread = next(m for m in state["data"] if m["id"] == "spread")["instances"]
    assert [i["gpu"]["devices"] for i in spread] == [[0], [1]]
    for i in spread:
        assert i["gpu_layers"] == units and [d["name"] for d in i["devices"] if d["kind"] != "cpu"] == [names[0]]
    shares = [i["fit"]["device_bytes"] for i in spread]
    assert [g["used_bytes"] for g in state["gpus"]] == shares
    text, _, _ = await complete(harness, "spread", PROMPT)

    # pinned to GPU 1: charged there only; its worker sees the server's second entry
    state = await load(harness, "pinned")
    pinned = instance(state, "pinned")
    assert pinned["gpu"]["devices"] == [1] and pinned["gpu_layers"] == units
    assert [g["used_bytes"] for g in state["gpus"]] == [shares[0], shares[1] + pinned["fit"]["device_bytes"]]
    assert [d["name"] for d in pinned["devices"] if d["kind"] != "cpu"] == [names[0]]  # it sees GPU 1 alone
    assert (await complete(harness, "pinned", PROMPT))[0] == text

    # split 3:1 over both: llama.cpp's split, as it logged it
    await harness.client.post("/models/unload", json={"model": "spread"})  # type: ignore[union-attr]
    state = await load(harness, "split")
    split = instance(state, "split")
    assert split["gpu"]["devices"] == [0, 1] and split["gpu_layers"] == units
    assert split["fit"]["tensor_split"] == [3.0, 1.0]  # given to llama.cpp as the weights
    on = {p["device"]: p for p in split["placement"] if p["device"] in names}
    assert list(on) == names and on[names[0]]["layers"] > 2 * on[names[1]]["layers"] > 0, split["placement"]
    assert on[names[0]]["first_layer"] == 0 and on[names[1]]["first_layer"] == on[names[0]]["layers"]
    assert on[names[1]]["output"] and not on[names[0]]["output"]
    logged = {(b.buffer, b.kind): b.bytes for b in plane.pools["split"].instances[0].info.buffers}  # type: ignore[union-attr]
    for name in names:
        assert abs(logged[(name, "model")] - on[name]["weight_bytes"]) <= MiB, (name, logged, on)
        assert abs(logged[(name, "kv")] - on[name]["kv_bytes"]) <= MiB // 8, (name, logged, on)
    per_gpu = {d["index"]: d["bytes"] for d in split["fit"]["devices"]}
    used = [g["used_bytes"] for g in (await view(harness))["gpus"]]
    assert used == [per_gpu[0], per_gpu[1] + pinned["fit"]["device_bytes"]]
    assert (await complete(harness, "split", PROMPT))[0] == text
    assert all(i.restarts == 0 for m in ("pinned", "split") for i in plane.pools[m].instances)


async def load_all(h: Harness, plane: Any, model: str) -> dict[str, Any]:
    """Load ``model`` and wait for every instance to be ready (the load returns at the first)."""
    async with plane.bus.subscribe() as q:
        await load(h, model)
        while not all(i.state.value == "ready" for i in plane.pools[model].instances):
            await asyncio.wait_for(q.get(), 1800)
    return await view(h)
