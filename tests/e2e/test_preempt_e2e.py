"""Fair-share preemption end to end: a real router and worker, two keys; the heavy key's
stream is paused for the light key and resumed, and its client sees only a pause: the
same greedy text, the same finish, no error."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.harness import Harness, _until
from support.keys import bearer, write_keys_file

pytestmark = pytest.mark.integration

PROMPTS = ["def fibonacci(n):\n", "1, 2, 3, 4, 5,"]
MAX_TOKENS = 40


def _body(prompt: str, stream: bool) -> dict[str, Any]:
    return {"model": "gemma", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}


async def _stream(c: httpx.AsyncClient, secret: str, prompt: str, started: asyncio.Event) -> tuple[str, str | None]:
    text, reason = "", None
    async with c.stream("POST", "/v1/completions", headers=bearer(secret), json=_body(prompt, True)) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            assert "error" not in ev, ev
            text += ev["choices"][0]["text"]
            reason = ev["choices"][0].get("finish_reason") or reason
            if text:
                started.set()
    return text, reason


async def test_a_preempted_stream_sees_only_a_pause(harness: Harness, model_path: Path) -> None:
    keys = harness.tmp / "keys.toml"
    secrets = write_keys_file(keys, heavy={"scopes": ["infer", "manage"]}, light={})
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1}},
                         worker_command=None, keys_file=str(keys))
    plane = await harness.start(cfg)
    c = harness.client
    want = []
    for p in PROMPTS:  # each alone first, on a fresh slot (no prefix of the other in it)
        r = await c.post("/v1/completions", headers=bearer(secrets["heavy"]), json=_body(p, False))
        assert r.status_code == 200, r.text
        want.append(r.json()["choices"][0]["text"])
    # the same two, running together: they fill both slots; then the light key asks
    s0, s1 = asyncio.Event(), asyncio.Event()
    h0 = asyncio.create_task(_stream(c, secrets["heavy"], PROMPTS[0], s0))
    await s0.wait()
    h1 = asyncio.create_task(_stream(c, secrets["heavy"], PROMPTS[1], s1))
    await s1.wait()
    pool = plane.pools["gemma"]
    light = await c.post("/v1/completions", headers=bearer(secrets["light"]),
                         json={"model": "gemma", "prompt": "Hello", "max_tokens": 4, "temperature": 0})
    assert light.status_code == 200, light.text
    got = [await h0, await h1]
    assert pool.preempt.stats.pauses == {"heavy": 1}  # one heavy sequence gave its slot
    assert got == [(w, "length") for w in want]  # as if nothing had happened
    await _until(lambda: pool.inflight == 0 and not pool.waiters)
    models = (await c.get("/models", headers=bearer(secrets["heavy"]))).json()
    pre = next(m for m in models["data"] if m["id"] == "gemma")["preemption"]
    assert pre["pauses"] == 1 and pre["kv_kept"] == 1 and pre["paused_seconds"] > 0 and pre["paused_now"] == 0
