"""Variants share one loaded model (control/plane.py's serving): the Nitro seed's two load
calls (one file, the same context and GPU layers, another pre_prompt) end with one worker
process; both ids answer at the same time, each with its own pre_prompt (greedy text equal
to that id served alone), under its own id, listed with variant_of and no memory of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.harness import Harness


def _load(model_id: str, path: Path, pre: str) -> dict[str, Any]:
    return {"model_id": model_id, "llama_model_path": str(path), "ctx_len": 512, "ngl": 0, "embedding": False,
            "pre_prompt": pre, "user_prompt": "USER: ", "ai_prompt": "ASSISTANT: "}


async def test_the_nitro_seeds_two_loads_end_with_one_worker(harness: Harness, model_path: Path) -> None:
    await harness.start(harness.config({}, worker_command=None, allowed_model_dirs=[str(model_path.parent)]))
    plane = harness.plane
    c = harness.client
    assert c is not None and plane is not None
    a, b = "tinyllama-1.1b-chat-v0.3", "tinyllama-1.1b-chat-v0.3-copy"
    r = await c.post("/inferences/llamacpp/loadmodel",
                     json=_load(a, model_path, "A chat between a curious user and an artificial intelligence"))
    assert r.status_code == 200, r.text
    r = await c.post("/inferences/llamacpp/loadmodel", json=_load(b, model_path, "You are a pirate. Say arr."))
    assert r.status_code == 200, r.text
    assert len(plane.pools[a].instances) == 1 and plane.pools[b].instances == []  # one worker process
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert listed[b]["variant_of"] == a and listed[a]["variant_of"] is None
    assert listed[b]["memory_bytes"] == 0 and listed[a]["memory_bytes"] > 0  # the weights once

    async def ask(model: str) -> dict[str, Any]:
        r = await c.post("/v1/chat/completions", json={
            "model": model, "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": "What is the biggest tech company?"}]})
        assert r.status_code == 200, r.text
        return r.json()

    ra, rb = await asyncio.gather(ask(a), ask(b))
    assert (ra["model"], rb["model"]) == (a, b)
    assert ra["usage"]["prompt_tokens"] != rb["usage"]["prompt_tokens"]  # each its own pre_prompt
    assert len(plane.pools[a].instances) == 1 and plane.pools[b].instances == []
    metrics = (await c.get("/metrics")).text
    assert f'model="{b}"' in metrics

    await plane.unload(plane.pools[a])  # now b alone: it loads for itself and answers the same
    alone = await ask(b)
    assert len(plane.pools[b].instances) == 1
    assert alone["choices"][0]["message"]["content"] == rb["choices"][0]["message"]["content"]
    assert alone["usage"]["prompt_tokens"] == rb["usage"]["prompt_tokens"]
