"""The official openai client against corral with real workers and the real model."""

from __future__ import annotations

import math
from pathlib import Path

import openai
import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration


def real(harness: Harness, models: dict, **server) -> object:  # noqa: ANN003
    return harness.config(models, worker_command=None, **server)


async def test_openai_client_chat_completions_embeddings(harness: Harness, model_path: Path) -> None:
    cfg = real(harness, {
        "gemma": {"path": str(model_path), "aliases": ["default"], "ctx_len": 1024, "n_parallel": 2, "threads": 1},
        "gemma-embed": {"path": str(model_path), "embedding": True, "ctx_len": 512, "n_parallel": 1, "threads": 1},
    })
    await harness.start(cfg)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)

    r = await client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name a color."}], max_tokens=8, temperature=0)
    assert r.model == "gemma" and r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert "\nUser:" not in r.choices[0].message.content

    pieces, finish, usage = [], None, None
    stream = await client.chat.completions.create(
        model="gemma", messages=[{"role": "user", "content": "Count: one, two,"}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})  # every token, past the template's turn markers
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            pieces.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(pieces) and finish == "length" and usage.completion_tokens == 12

    c = await client.completions.create(model="gemma", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert c.choices[0].text and c.usage.completion_tokens <= 6

    e = await client.embeddings.create(model="gemma-embed", input=["hello world", "goodbye"])
    assert len(e.data) == 2
    vec = e.data[0].embedding
    assert len(vec) == 640  # gemma-3-270m's n_embd
    assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-3)
    assert e.usage.prompt_tokens > 0

    with pytest.raises(openai.NotFoundError) as ei:
        await client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert ei.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bi:  # fill-in-the-middle needs FIM tokens, which it lacks
        await client.completions.create(model="gemma", prompt="x", suffix="y")
    assert "gemma" in bi.value.message and "FIM" in bi.value.message
    await client.close()


async def test_no_config_serves_the_embedded_default_model(harness: Harness, model_path: Path) -> None:
    from corral.config.file import load_config

    cfg = load_config(None, server_overrides={"log_dir": str(harness.tmp / "logs")},
                      model_overrides={"threads": 1, "ctx_len": 512, "n_parallel": 1})
    plane = await harness.start(cfg, embedded=True)
    assert [p.spec.id for p in plane.pools.values()] == ["gemma-3-270m"]
    assert plane.pools["gemma-3-270m"].spec.path == model_path
    r = await harness.client.post("/v1/completions", json={"model": "default", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "gemma-3-270m"
