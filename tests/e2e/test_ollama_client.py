"""The official ``ollama`` client against corral: real workers, the real model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ollama
import pytest

from support.harness import Harness
from store.conftest import small_gguf
from store.fake_hub import FakeHub

pytestmark = pytest.mark.integration


def _models(model_path: Path) -> dict[str, Any]:
    return {
        "gemma:latest": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1},
        "ggml-org/gemma-3-270m-GGUF:Q4_K_M": {"path": str(model_path), "embedding": True, "ctx_len": 512,
                                              "n_parallel": 1, "threads": 1},
    }


async def test_ollama_client_generation_and_models(harness: Harness, model_path: Path) -> None:
    cfg = harness.config(_models(model_path), worker_command=None)
    await harness.start(cfg)
    client = ollama.AsyncClient(host=harness.base_url)

    names = [m.model for m in (await client.list()).models]
    assert names == ["gemma:latest", "ggml-org/gemma-3-270m-GGUF:Q4_K_M"]
    m = (await client.list()).models[0]
    assert m.details.format == "gguf" and m.details.family == "gemma3"
    assert m.details.quantization_level == "Q4_K_M" and m.details.parameter_size.endswith("M")
    assert m.size == model_path.stat().st_size and len(m.digest) == 64
    assert (await client.ps()).models == []

    # implicit :latest, non-streamed chat with the final statistics in nanoseconds
    r = await client.chat(model="gemma", messages=[{"role": "user", "content": "Name a color."}],
                          options={"num_predict": 6, "temperature": 0})
    assert r.model == "gemma:latest" and r.done and r.done_reason in ("stop", "length")
    assert r.message.role == "assistant" and r.message.content
    assert 0 < r.eval_count <= 6 and r.prompt_eval_count > 0
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0
    assert r.load_duration > 0  # this request loaded the model

    pieces, last = [], None
    async for part in await client.chat(model="gemma:latest", stream=True,
                                        messages=[{"role": "user", "content": "Count: one, two,"}],
                                        options={"num_predict": 8, "temperature": 0, "seed": 1}):
        if not part.done:
            pieces.append(part.message.content)
        last = part
    assert last is not None and last.done and last.eval_count <= 8
    whole = await client.chat(model="gemma:latest", messages=[{"role": "user", "content": "Count: one, two,"}],
                              options={"num_predict": 8, "temperature": 0, "seed": 1})
    assert len(pieces) >= 2 and "".join(pieces) == whole.message.content  # the same text, streamed

    g = await client.generate(model="gemma", prompt="The capital of France is", raw=True,
                              options={"num_predict": 5, "temperature": 0, "stop": ["\n\n"]})
    assert g.response and g.done and g.eval_count <= 5
    streamed = [p.response async for p in await client.generate(
        model="gemma", prompt="The capital of France is", raw=True, stream=True,
        options={"num_predict": 5, "temperature": 0, "stop": ["\n\n"]})]
    assert len(streamed) >= 2 and "".join(streamed) == g.response  # the same greedy text, in pieces

    ps = (await client.ps()).models
    assert [p.model for p in ps] == ["gemma:latest"] and ps[0].size > 0 and ps[0].context_length == 512
    shown = await client.show("gemma")
    assert shown.details.family == "gemma3" and shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.modelinfo["general.parameter_count"] > 100_000_000 and shown.capabilities == ["completion"]
    assert "num_ctx 512" in (shown.parameters or "")

    e = await client.embed(model="ggml-org/gemma-3-270m-GGUF:Q4_K_M", input=["hello world", "goodbye"])
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 640
    assert math.isclose(math.sqrt(sum(x * x for x in e.embeddings[0])), 1.0, rel_tol=1e-3)
    legacy = await client.embeddings(model="ggml-org/gemma-3-270m-GGUF:Q4_K_M", prompt="hello world")
    assert len(legacy.embedding) == 640

    with pytest.raises(ollama.ResponseError) as ei:
        await client.chat(model="nope", messages=[{"role": "user", "content": "x"}])
    assert ei.value.status_code == 404 and "nope" in ei.value.error
    with pytest.raises(ollama.ResponseError) as ei:
        await client.generate(model="gemma", prompt="x", images=[b"\x89PNG"])
    assert ei.value.status_code == 400 and "images" in ei.value.error

    # keep_alive=0: the model unloads once the request ends
    async with harness.plane.bus.subscribe() as q:
        await client.generate(model="gemma", prompt="Hi", raw=True, keep_alive=0, options={"num_predict": 1})
        while True:
            ev = await q.get()
            if ev.name == "status_change" and ev["model"] == "gemma:latest" and ev["new"] == "stopped":
                break
    assert [p.model for p in (await client.ps()).models] == ["ggml-org/gemma-3-270m-GGUF:Q4_K_M"]

    await client.copy("gemma:latest", "my-gemma")
    r = await client.generate(model="my-gemma", prompt="Hi", raw=True, keep_alive="-1",
                              options={"num_predict": 1})
    assert r.model == "gemma:latest" and harness.plane.pools["gemma:latest"].pinned


async def test_ollama_pull_delete_with_progress(harness: Harness, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        data = small_gguf(3_000_000)
        hub.add("owner/tiny-GGUF/tiny-Q8_0.gguf", data)
        hub.files["owner/tiny-GGUF/tiny-Q8_0.gguf"].behavior.bytes_per_s = 6_000_000
        cfg = harness.config({}, worker_command=None, models_dir=str(tmp_path / "models"))
        await harness.start(cfg, use_store=True)
        client = ollama.AsyncClient(host=harness.base_url)

        parts = [p async for p in await client.pull("owner/tiny-GGUF:Q8_0", stream=True)]
        statuses = [p.status for p in parts]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
        progress = [p for p in parts if p.digest]
        assert progress and progress[-1].completed == progress[-1].total == len(data)
        assert all(a.completed <= b.completed for a, b in zip(progress, progress[1:]))
        # the model answers to the name it was pulled by
        assert "owner/tiny-GGUF:Q8_0" in [m.model for m in (await client.list()).models]
        assert (tmp_path / "models" / "owner%2Ftiny-GGUF%3AQ8_0.gguf").is_file()
        assert (await client.pull("owner/tiny-GGUF:Q8_0")).status == "success"  # already there

        with pytest.raises(ollama.ResponseError) as ei:
            await client.pull("llama3.2:1b")  # an Ollama registry name is not a corral source
        assert ei.value.status_code == 400 and "not from the Ollama registry" in ei.value.error

        assert (await client.delete("owner/tiny-GGUF:Q8_0")).status == "success"
        assert "owner/tiny-GGUF:Q8_0" not in [m.model for m in (await client.list()).models]
        with pytest.raises(ollama.ResponseError) as ei:
            await client.delete("owner/tiny-GGUF:Q8_0")
        assert ei.value.status_code == 404
