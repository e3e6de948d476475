"""``n_parallel = "auto"`` through a real worker and the real model, with the host's memory
as the test inventory says (CORRAL_FAKE_DEVICES): the slots it got and why, in GET /models,
/props and the slots that answer at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


async def test_auto_slots_come_from_the_host_memory_and_a_number_set_is_kept(
        harness: Harness, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.fit.layout import read_layout
    from corral.fit.slots import HOST_SHARE, plan_slots
    from corral.model.settings import ModelSettings

    layout = read_layout(model_path)
    one = plan_slots(layout, ModelSettings(ctx_len=512), host_available_bytes=10**15)
    # a host whose share (HOST_SHARE) holds the weights and between 5 and 6 slots of 512 cells
    available = int((sum(layout.layer_bytes) + layout.input_bytes + layout.output_bytes + 5 * one.slot_bytes
                     + one.slot_bytes // 2) / HOST_SHARE)
    expected = plan_slots(layout, ModelSettings(ctx_len=512), host_available_bytes=available)
    assert expected.n_slots == 5
    monkeypatch.setenv("CORRAL_FAKE_DEVICES", json.dumps(
        [{"name": "CPU", "backend": "CPU", "kind": "cpu", "free_bytes": available, "total_bytes": 8 * 1024 * MiB}]))
    cfg = harness.config({"auto": {"path": str(model_path), "ctx_len": 512, "n_parallel": "auto", "threads": 1},
                          "set": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1}},
                         worker_command=None, max_loaded_models=2)
    await harness.start(cfg)
    c = harness.client
    for model in ("auto", "set"):
        r = await c.post("/models/load", json={"model": model})
        assert r.status_code == 200, r.text
    r = await c.get("/models")
    entries = {m["id"]: m for m in r.json()["data"]}
    auto, fixed = entries["auto"], entries["set"]
    assert auto["settings"]["n_parallel"] == "auto" and auto["settings"]["n_parallel_max"] == 64
    [inst] = auto["instances"]
    plan = inst["slots"]["plan"]
    assert inst["slots"]["total"] == 5 and inst["n_ctx_slot"] == 512
    assert plan["n_slots"] == 5 and plan["asked"] == "auto" and plan["where"] == "host"
    assert plan["reason"] == expected.reason and "5 slots of 512 cells" in plan["reason"]
    [finst] = fixed["instances"]
    assert finst["slots"]["total"] == 2 and finst["n_ctx_slot"] == 512
    assert finst["slots"]["plan"]["reason"] == "n_parallel = 2 (set)"
    r = await c.get("/props", params={"model": "auto"})
    assert r.json()["total_slots"] == 5 and r.json()["slots_plan"]["n_slots"] == 5
    # the five slots serve five requests side by side
    bodies = [{"model": "auto", "prompt": f"Count to {i}:", "max_tokens": 4, "temperature": 0} for i in range(5)]
    answers = await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
