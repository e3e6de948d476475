"""The seeds' GPU cases on one real device (Vulkan0 on Mesa's lavapipe in CI, CUDA0 with
CORRAL_GPU_BACKEND=cuda): real workers and the embedded model. Lean, because a lavapipe
worker is slow to start (its shader pipelines, kept in Mesa's cache on disk) and decodes
about a token a second: one router, three worker starts, a few tokens each.

- ``GET /models/fit`` before the load (the page's estimate) says what the worker then does:
  every layer on the device, the context a slot, the device bytes within 10%.
- ``n_gpu_layers = "auto"`` puts the whole model on the device; GET /models shows the plan,
  the placement and the device's memory as the backend reports it; the bytes corral planned
  on the device are what llama.cpp logged allocating there (weights and KV cache).
- Two models (two worker processes) decode on the one device at the same time, streaming,
  and each gives the greedy tokens it gives alone there.
- ``gpu_memory_budget`` below three models' need: the third evicts the idle LRU one on the
  device (by memory: max_loaded_models allows all three).
- A plan that cannot fit (a fixed n_gpu_layers with too large a context) fails with the
  reason naming the device; the others keep serving.
- A busy model is never evicted: with both loaded models decoding, a third load waits for
  room and fails 503 ``capacity_timeout`` naming the device and the bytes.
- ``max_loaded_models = 1`` swaps on the device, and the prompt cache survives the swap.

Each check fails with its mutation (done by hand on lavapipe, 2026-12-03): ``GpuBudget.place``
ignoring what is used (the budget ignored: c loads, nothing stopped); the eviction skipped in
``Admission`` (c's load 503s); a busy model evictable (``ModelPool.evictable`` without
``idle``: the held stream fails); ``ModelLayout.on_devices`` ignoring the device's largest
matrix (planned weights 235 MiB against the 65 MiB llama.cpp logged on Vulkan0); the swap
with ``prompt_cache_disk = 0`` (0 cached tokens instead of 78).

Warm (the shader cache kept), the group takes about a minute; cold, lavapipe compiles each
pipeline at the first graph that needs it, a matrix-vector product once per weight type and
batch width (a minute or more each), so every prompt here goes a token at a time
(``n_batch = 1``: the width a decode uses) and without flash attention: the whole group cold
7 minutes on a fresh 2-core machine, was 20.8 with 7-token batches and the draft's flash
attention (docs/benchmarks/2026-12-07-fresh-machine.md).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.control.placement.gpus import probe_devices
from corral.fit.layout import read_layout
from corral.fit.plan import device_need
from corral.model.settings import ModelSettings
from support.harness import Harness

from .conftest import DEVICE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

MiB = 1024 * 1024
# own_instances: each id its own worker process on the device (the seeds' case), not a variant
# sharing the first one's weights (what tables with the same file and load settings are otherwise).
# flash_attn off, in the model, its draft and its projector: flash attention's shaders are
# lavapipe's slowest to compile (the first 7-token prompt, cold, 773 s with it and 468 s without
# on 2 quiet cores). n_batch 1: every prompt goes a token at a time, through the pipelines a
# decode uses; each other batch width is a pipeline per weight type for LLVM to compile once
# (a minute or more each on 2 cores: the swap's 7-token batches alone cost 6 minutes cold)
SETTINGS = {"ctx_len": 512, "n_parallel": 1, "threads": 2, "own_instances": True, "flash_attn": False,
            "n_batch": 1}
PROMPT = "One, two, three,"
TOKENS = 4
# 64 tokens or more: the prompt cache keeps it (worker/prompt_cache.py MIN_SAVE_TOKENS)
LONG_PROMPT = " ".join(f"Rule {i}: the {('red', 'blue', 'green')[i % 3]} stone goes to box {i % 5}." for i in range(6))


async def stream(h: Harness, model: str, seen: list[tuple[str, int]]) -> str:
    """A greedy streamed completion; each text chunk's arrival goes to ``seen``."""
    text = []
    body = {"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "stream": True}
    async with h.client.stream("POST", "/v1/completions", json=body, timeout=1800) as r:  # type: ignore[union-attr]
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0]["text"] if chunk["choices"] else ""
            if piece:
                seen.append((model, len(text)))
                text.append(piece)
    return "".join(text)


async def load(h: Harness, model: str) -> dict[str, Any]:
    r = await h.client.post("/models/load", json={"model": model}, timeout=1800)  # type: ignore[union-attr]
    assert r.status_code == 200, r.text
    return await view(h)


async def view(h: Harness) -> dict[str, Any]:
    r = await h.client.get("/models")  # type: ignore[union-attr]
    return r.json()  # type: ignore[no-any-return]


def instance(models: dict[str, Any], model: str) -> dict[str, Any]:
    entry = next(m for m in models["data"] if m["id"] == model)
    return entry["instances"][0]  # type: ignore[no-any-return]


async def test_the_seeds_cases_on_one_device(harness: Harness, model_path: Path) -> None:
    [gpu0] = [d for d in probe_devices([sys.executable, "-m", "corral.worker"]) if d.kind == "gpu"]
    layout = read_layout(model_path).on_devices([gpu0])  # lavapipe: the 170 MiB tied head stays on the host
    layers = layout.n_layer  # 18 for the embedded Gemma 3 270M, and its head: 19 units to offload
    need = device_need(layout, ModelSettings(**SETTINGS), budget_bytes=1 << 40)
    budget = 2 * need + need // 2  # two models fit, three do not
    models = {m: {"path": str(model_path), **SETTINGS} for m in ("a", "b", "c")}
    models["too_big"] = {"path": str(model_path), **SETTINGS, "n_gpu_layers": layers + 1, "ctx_len": 1 << 20}
    cfg = harness.config(models, worker_command=None, gpu_memory_margin=0, gpu_memory_budget=[budget],
                         max_loaded_models=3, load_timeout_s=1800, queue_timeout_s=5)
    plane = await harness.start(cfg)
    # the page's estimate before the load (GET /models/fit): what the worker then does
    fit = (await harness.client.get("/models/fit", params={"model": "a"})).json()  # type: ignore[union-attr]

    # auto: every layer and the head on the device, as planned and as llama.cpp allocated
    state = await load(harness, "a")
    a = instance(state, "a")
    assert fit["verdict"] == "gpu" and fit["gpu_layers"] == a["fit"]["n_gpu_layers"], (fit, a["fit"])
    assert fit["ctx_per_slot"] == a["n_ctx_slot"], (fit, a["n_ctx_slot"])
    assert abs(fit["gpu_bytes"] - a["fit"]["device_bytes"]) <= a["fit"]["device_bytes"] // 10, (fit, a["fit"])
    [gpu] = state["gpus"]
    device = f"{DEVICE}0"
    assert gpu["name"] == device and gpu["budget_bytes"] == budget
    [seen] = [d for d in a["devices"] if d["kind"] in ("gpu", "igpu")]
    assert seen["name"] == device and gpu["total_bytes"] == seen["total_bytes"] > need  # the backend's numbers
    assert a["gpu"]["devices"] == [0] and a["fit"]["device"] == device
    assert a["gpu_layers"] == a["fit"]["n_gpu_layers"] == a["fit"]["n_layers"] == layers + 1
    *on_gpu, host = a["placement"]
    assert [(p["device"], p["first_layer"], p["layers"], p["output"]) for p in on_gpu] == [(device, 0, layers, True)]
    assert (host["device"], host["layers"], host["kv_bytes"]) == ("CPU", 0, 0)
    [p] = on_gpu
    assert p["weight_bytes"] + p["kv_bytes"] + p["compute_bytes"] == a["fit"]["device_bytes"] == gpu["used_bytes"]
    logged = {(b.buffer, b.kind): b.bytes for b in plane.pools["a"].instances[0].info.buffers}  # type: ignore[union-attr]
    assert abs(logged[(device, "model")] - p["weight_bytes"]) <= MiB, logged  # llama.cpp logs MiB, 2 decimals
    assert abs(logged[(device, "kv")] - p["kv_bytes"]) <= MiB // 8, logged
    assert (device, "compute") in logged and ("CPU", "kv") not in logged, logged

    # the seeds' case: two worker processes on the one device, streaming at once; the greedy
    # tokens each gives alone
    order: list[tuple[str, int]] = []
    alone_a = await stream(harness, "a", order)
    state = await load(harness, "b")
    b = instance(state, "b")
    assert b["gpu"]["devices"] == [0] and b["gpu_layers"] == layers + 1
    assert state["gpus"][0]["used_bytes"] == a["fit"]["device_bytes"] + b["fit"]["device_bytes"]
    alone_b = await stream(harness, "b", order)
    order.clear()
    both_a, both_b = await asyncio.gather(stream(harness, "a", order), stream(harness, "b", order))
    assert (both_a, both_b) == (alone_a, alone_b) and len(alone_a) > 0
    firsts = {m: order.index((m, 0)) for m in ("a", "b")}
    lasts = {m: max(i for i, (who, _) in enumerate(order) if who == m) for m in ("a", "b")}
    assert firsts["a"] < lasts["b"] and firsts["b"] < lasts["a"], order  # they overlapped
    assert all(plane.pools[m].instances[0].restarts == 0 for m in ("a", "b"))  # no crash
    r = await harness.client.post("/v1/completions", json={  # type: ignore[union-attr]
        "model": "b", "prompt": PROMPT, "max_tokens": 1, "temperature": 0}, timeout=1800)
    assert r.status_code == 200  # b used last: a is the LRU one

    # the budget holds two: the third evicts the idle LRU one (a) on the device
    async with plane.bus.subscribe() as q:
        state = await load(harness, "c")
        stopped = [ev async for ev in _drain(q) if ev.get("new") == "stopped"]
    assert [ev["model"] for ev in stopped] == ["a"]
    assert not plane.pools["a"].occupies and plane.pools["b"].occupies
    c = instance(state, "c")
    assert c["gpu"]["devices"] == [0] and c["gpu_layers"] == layers + 1
    assert state["gpus"][0]["used_bytes"] == b["fit"]["device_bytes"] + c["fit"]["device_bytes"] <= budget

    # a plan that cannot fit fails with the reason, naming the device; the others keep serving
    r = await harness.client.post("/models/load", json={"model": "too_big"})  # type: ignore[union-attr]
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed", r.text
    assert device in r.json()["error"]["message"]

    # a busy model is never evicted: with b and c both decoding, loading a waits for room
    # (queue_timeout_s), then fails 503 naming the device and the bytes; both keep serving
    started = {m: asyncio.Event() for m in ("b", "c")}
    lines: dict[str, list[str]] = {"b": [], "c": []}
    holds = [asyncio.create_task(hold(harness, m, started[m], lines[m])) for m in ("b", "c")]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), 1800)
    r = await harness.client.post("/models/load", json={"model": "a"}, timeout=1800)  # type: ignore[union-attr]
    assert not any(t.done() for t in holds), lines  # still decoding when the wait ended
    for t in holds:
        t.cancel()
    await asyncio.gather(*holds, return_exceptions=True)
    assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_timeout", r.text
    message = r.json()["error"]["message"]
    assert f"GPU 0 ({device})" in message and "free of its budget" in message and "needs" in message, message
    assert not plane.pools["a"].occupies and plane.pools["b"].occupies and plane.pools["c"].occupies
    assert all(plane.pools[m].instances[0].restarts == 0 for m in ("b", "c"))
    assert await stream(harness, "c", []) == alone_a


async def test_a_swap_on_the_device_keeps_the_prompt_cache(harness: Harness, model_path: Path,
                                                           tmp_path: Path) -> None:
    """``max_loaded_models = 1``: a second model swaps the first off the device (its bytes
    freed there), and the first one's prefix comes back from the prompt cache on disk when it
    returns, with the greedy tokens a fresh prefill gave."""
    models = {m: {"path": str(model_path), **SETTINGS} for m in ("m1", "m2")}
    cfg = harness.config(models, worker_command=None, max_loaded_models=1, state_dir=str(tmp_path / "state"),
                         load_timeout_s=1800, queue_timeout_s=1800)
    plane = await harness.start(cfg)
    fresh, n_prompt, cached = await complete(harness, "m1", LONG_PROMPT)
    assert cached == 0
    m1 = instance(await view(harness), "m1")
    assert m1["gpu"]["devices"] == [0] and m1["gpu_layers"] == m1["fit"]["n_layers"]
    await complete(harness, "m2", PROMPT)  # m1 off the device
    state = await view(harness)
    assert not plane.pools["m1"].occupies
    assert state["gpus"][0]["used_bytes"] == instance(state, "m2")["fit"]["device_bytes"]
    again, _, cached = await complete(harness, "m1", LONG_PROMPT)  # m2 off, m1 back
    assert (again, cached) == (fresh, n_prompt - 4)  # all but the prompt's last cut (worker/prefill.py)
    await plane.pools["m1"].instances[0].fetch_stats()
    m1 = instance(await view(harness), "m1")
    assert m1["gpu"]["devices"] == [0] and m1["prompt_cache"]["disk_hits"] == 1
    assert (await view(harness))["gpus"][0]["used_bytes"] == m1["fit"]["device_bytes"]


async def complete(h: Harness, model: str, prompt: str) -> tuple[str, int, int]:
    """A greedy completion: its text, prompt tokens and cached prompt tokens."""
    r = await h.client.post("/v1/completions", json={  # type: ignore[union-attr]
        "model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}, timeout=1800)
    assert r.status_code == 200, r.text
    body = r.json()
    usage = body["usage"]
    return body["choices"][0]["text"], usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


async def hold(h: Harness, model: str, started: asyncio.Event, seen: list[str]) -> None:
    """A long greedy stream that keeps the model busy (``started`` at its first token) until
    it is cancelled (then dropped: the router cancels it); its lines go to ``seen``."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
    async with h.client.stream("POST", "/v1/completions", json=body, timeout=1800) as r:  # type: ignore[union-attr]
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen.append(line)
                started.set()


async def _drain(q: "asyncio.Queue[Any]") -> Any:
    """The events already on ``q``."""
    while not q.empty():
        yield q.get_nowait()
