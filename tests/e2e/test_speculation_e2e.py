"""Speculative decoding through the router: a model with ``speculative = "ngram"``, the
per-request switch on the OpenAI routes, and the counters in GET /models and /metrics."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"
PROMPT = "Here is some code:\n" + CODE + "\nThe same code again, unchanged:\n"


async def _speculation(harness: Harness) -> dict:
    for pool in harness.plane.pools.values():
        for inst in pool.instances:
            await inst.fetch_stats()
    r = await harness.client.get("/models")
    model = next(m for m in r.json()["data"] if m["id"] == "gemma")
    assert model["settings"]["speculative"] == "ngram"
    return model["instances"][0]["speculation"]


async def test_speculation_through_the_router(harness: Harness, model_path: Path) -> None:
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 2048, "n_parallel": 2, "threads": 1,
                                    "speculative": "ngram", "draft_max": 8}}, worker_command=None)
    await harness.start(cfg)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
    off = await client.completions.create(model="gemma", prompt=PROMPT, max_tokens=48, temperature=0,
                                          extra_body={"speculative": False})
    assert off.usage.completion_tokens == 48
    before = await _speculation(harness)
    assert before["draft_tokens"] == 0  # the request turned it off
    on = await client.completions.create(model="gemma", prompt=PROMPT, max_tokens=48, temperature=0)
    after = await _speculation(harness)
    assert after["draft_tokens"] > 0 and after["accepted_tokens"] > 0
    assert after["tokens_per_step"] > 1.0
    assert on.choices[0].text[:40] == off.choices[0].text[:40]  # (later tokens may part inside the noise)
    metrics = (await harness.client.get("/metrics")).text
    assert 'corral_spec_acceptance_rate{instance="0",model="gemma"' in metrics
