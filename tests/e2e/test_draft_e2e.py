"""A draft model through the router: ``speculative = "draft"`` with a relative ``draft_model``
(the embedded model as its own draft, found next to the model file), the per-request switch,
the method and the draft's memory in GET /models and /metrics; a draft with another
vocabulary fails the load with a reason that says so, and the other model still serves."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from testkit.gguf_models import write_reranker
from support.harness import Harness

pytestmark = pytest.mark.integration

PROMPT = "Here is some code:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\nThe same code again:\n"


async def _model(harness: Harness, mid: str) -> dict:
    for inst in harness.plane.pools[mid].instances:
        await inst.fetch_stats()
    r = await harness.client.get("/models")
    return next(m for m in r.json()["data"] if m["id"] == mid)


async def test_a_draft_model_through_the_router(harness: Harness, model_path: Path) -> None:
    reranker = write_reranker(harness.tmp / "rerank.gguf")
    common = {"path": str(model_path), "ctx_len": 2048, "n_parallel": 2, "threads": 1, "speculative": "draft"}
    cfg = harness.config({"gemma": {**common, "draft_model": model_path.name, "draft_max": 8},
                          "wrong": {**common, "draft_model": str(reranker)}}, worker_command=None)
    await harness.start(cfg)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
    off = await client.completions.create(model="gemma", prompt=PROMPT, max_tokens=32, temperature=0,
                                          extra_body={"speculative": False})
    assert off.usage is not None and off.usage.completion_tokens == 32
    before = (await _model(harness, "gemma"))["instances"][0]
    assert before["speculation"]["method"] == "draft" and before["speculation"]["draft_tokens"] == 0
    assert before["speculation"]["draft_model"] == str(model_path)
    draft = before["memory"]["draft"]
    assert draft["path"] == str(model_path) and draft["model_bytes"] > 100 << 20
    assert before["memory"]["model_bytes"] >= 2 * draft["model_bytes"]  # the model's and its draft's
    on = await client.completions.create(model="gemma", prompt=PROMPT, max_tokens=32, temperature=0)
    after = (await _model(harness, "gemma"))["instances"][0]["speculation"]
    assert after["draft_tokens"] > 0 and after["acceptance_rate"] > 0.8 and after["tokens_per_step"] > 1.0
    assert on.choices[0].text[:30] == off.choices[0].text[:30]  # (later tokens may part inside the noise)
    metrics = (await harness.client.get("/metrics")).text
    assert 'corral_spec_method{instance="0",method="draft",model="gemma"' in metrics

    r = await harness.client.post("/v1/completions", json={"model": "wrong", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
    wrong = await _model(harness, "wrong")
    assert "207 tokens" in wrong["status"]["reason"] and "vocabulary" in wrong["status"]["reason"]
    again = await client.completions.create(model="gemma", prompt="Hello", max_tokens=4, temperature=0)
    assert again.usage is not None and again.usage.completion_tokens == 4
