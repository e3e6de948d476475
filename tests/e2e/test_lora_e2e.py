"""LoRA adapters through the router, real workers: per-request ``lora`` on the OpenAI routes,
GET/POST /lora-adapters, an adapter model id served by the base's worker, bad ids, a bad
adapter file (the load fails with a reason, the server stays up)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from testkit.gguf_lora import write_bad_lora, write_lora
from support.harness import Harness

pytestmark = pytest.mark.integration

PROMPT = "The capital of France is"


async def _text(client: openai.AsyncOpenAI, model: str = "gemma", **extra: object) -> str:
    """The greedy text's first 30 characters: a prompt prefilled whole and one served from the
    slot's cache are decoded in batches of other shapes, whose noise may part a near tie later on."""
    r = await client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                        extra_body=extra or None)
    return r.choices[0].text[:30]


async def test_lora_through_the_router(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    a = write_lora(model_path, tmp_path / "a.gguf", seed=7)
    b = write_lora(model_path, tmp_path / "b.gguf", seed=8)
    cfg = harness.config({"gemma": {
        "path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1,
        "lora": [{"id": "a", "path": str(a), "scale": 0.0},
                 {"id": "b", "path": str(b), "scale": 1.0, "model": "gemma-b"}]}}, worker_command=None)
    await harness.start(cfg)
    http = harness.client
    assert http is not None
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)

    base = await _text(client)  # b has a model id of its own: off for gemma's requests
    with_a = await _text(client, lora=[{"id": "a", "scale": 1.0}])
    assert with_a != base
    assert await _text(client, lora=[{"id": 0, "scale": 1.0}]) == with_a  # llama-server's integer id
    with_b = await _text(client, lora=[{"id": 1, "scale": 1.0}])
    assert with_b not in (base, with_a)
    assert await _text(client, "gemma-b") == with_b  # the adapter model: base + b, same worker
    assert len(harness.plane.pools["gemma"].instances) == 1

    chat = await client.chat.completions.create(model="gemma", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=4, temperature=0,
                                                extra_body={"lora": [{"id": "a", "scale": 1.0}]})
    assert chat.choices[0].finish_reason in ("length", "stop")

    for bad in ([{"id": 5, "scale": 1.0}], [{"id": "nope", "scale": 1.0}], [{"id": "a", "scale": "x"}]):
        with pytest.raises(openai.BadRequestError) as err:
            await _text(client, lora=bad)
        assert "lora" in str(err.value)

    r = await http.get("/lora-adapters")
    assert r.status_code == 200
    assert [(x["id"], x["name"], x["path"], x["scale"]) for x in r.json()] == [
        (0, "a", str(a), 0.0), (1, "b", str(b), 0.0)]  # b: only for gemma-b
    r = await http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])
    assert r.status_code == 200, r.text
    assert [x["scale"] for x in (await http.get("/lora-adapters?model=gemma")).json()] == [1.0, 0.0]
    assert await _text(client) == with_a  # the new default
    assert await _text(client, lora=[{"id": "a", "scale": 0.0}]) == base  # a request's own scales win
    r = await http.post("/lora-adapters", json=[{"id": 9, "scale": 1.0}])
    assert r.status_code == 400 and "unknown adapter id" in r.text
    r = await http.post("/lora-adapters", json={"id": 0})
    assert r.status_code == 400
    await http.post("/lora-adapters", json=[])
    assert await _text(client) == base  # every adapter at 0


async def test_a_bad_adapter_file_fails_the_load_with_its_reason(harness: Harness, model_path: Path,
                                                                 tmp_path: Path) -> None:
    bad = write_bad_lora(model_path, tmp_path / "bad.gguf")
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 512, "n_parallel": 1, "threads": 1,
                                    "lora": [{"id": "bad", "path": str(bad)}]}},
                         worker_command=None, max_restarts=0)
    await harness.start(cfg)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        await _text(client)
    assert "LoRA adapter 'bad'" in str(err.value)
    assert (await harness.client.get("/health")).status_code == 200
