"""Editors and RAG stacks over HTTP with real workers: /infill (the body llama.vscode sends),
suffix on /v1/completions and /api/generate, /v1/rerank, embeddings from a generative
model, /props, /slots, /apply-template, and the 4xx of bad input."""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

# llama.vscode's completion request (src/llama-server.ts, createRequestPayload): its default
# sampling (top_k 40, top_p 0.99, samplers, cache_prompt) and its ring-buffer chunks
# ({text, time, filename}); n_predict 128 and the t_max_* are its configuration's defaults.
VSCODE_INFILL = {
    "input_prefix": "import math\n\ndef circle_area(r):\n    ",
    "input_suffix": "\n\nprint(circle_area(2.0))\n",
    "input_extra": [{"text": "def square(x):\n    return x * x\n", "time": 1733000000000, "filename": "geometry.py"}],
    "prompt": "return",
    "n_predict": 16,
    "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
    "n_indent": 4,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 1000,
}
# the request it sends to warm the cache with new chunks (createRequestPayload(noPredict=true))
VSCODE_WARMUP = {"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "x = 1\n", "filename": "a.py"}],
                 "prompt": "", "n_predict": 0, "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500,
                 "t_max_predict_ms": 1}


def _models(fim: Path, reranker: Path, gemma: Path) -> dict[str, dict[str, Any]]:
    common = {"threads": 1, "n_parallel": 2}
    return {"coder": {"path": str(fim), "ctx_len": 2048, **common},
            "gemma": {"path": str(gemma), "ctx_len": 1024, **common},
            "ranker": {"path": str(reranker), "ctx_len": 1024, **common}}


def _openai_error(r: Any, status: int = 400) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and "Traceback" not in r.text
    return str(body["error"]["message"])


async def test_editor_routes(harness: Harness, fim_model_path: Path, reranker_path: Path, model_path: Path) -> None:
    await harness.serve(_models(fim_model_path, reranker_path, model_path), worker_command=None)
    c = harness.client

    # ---- infill: llama.vscode's own request (it names no model: the one with FIM tokens
    # answers), answered with a completion
    r = await c.post("/infill", json=VSCODE_INFILL)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "coder"
    assert isinstance(body["content"], str) and body["stop"] is True
    assert body["tokens_predicted"] >= 1 and body["tokens_evaluated"] > 20
    assert body["timings"]["predicted_n"] == body["tokens_predicted"] and "prompt_ms" in body["timings"]
    r = await c.post("/infill", json=VSCODE_WARMUP)
    assert r.status_code == 200 and r.json()["content"] == "" and r.json()["tokens_predicted"] == 0
    # greedy is repeatable, and streaming gives the same text. Infill's prompt decodes as
    # llama-server's does, in one batch; the same request again reuses all but its last token,
    # decoded alone, which on some CPUs rounds a near tie the other way (measured on a Xeon
    # with AMX: "if a > b:" fresh, "print(a, b)" reused). So the repeats are compared, each
    # from the prefix the one before left (a completion's reuse answers as its fresh decode:
    # tests/worker/test_prompt_cuts.py).
    greedy = {"model": "coder", "input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 8,
              "temperature": 0}
    assert (await c.post("/infill", json=greedy)).json()["content"]
    first = (await c.post("/infill", json=greedy)).json()
    assert first["content"] and first["timings"]["cache_n"] == first["tokens_evaluated"] - 1, first  # reused
    assert (await c.post("/infill", json=greedy)).json()["content"] == first["content"]
    async with c.stream("POST", "/infill", json={**greedy, "stream": True}) as s:
        events = [line[6:] async for line in s.aiter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events]
    assert chunks[-1]["stop"] is True and all(not x["stop"] for x in chunks[:-1])
    assert "".join(x["content"] for x in chunks) == first["content"]

    # the same gap through OpenAI's and Ollama's suffix
    r = await c.post("/v1/completions", json={"model": "coder", "prompt": "def add(a, b):\n    ", "suffix": "\n",
                                              "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == first["content"]
    r = await c.post("/api/generate", json={"model": "coder", "prompt": "def add(a, b):\n    ", "suffix": "\n",
                                            "stream": False, "options": {"num_predict": 8, "temperature": 0}})
    assert r.status_code == 200 and r.json()["response"] == first["content"]
    caps = (await c.post("/api/show", json={"model": "coder"})).json()["capabilities"]
    assert "insert" in caps and "insert" not in (await c.post("/api/show", json={"model": "gemma"})).json()["capabilities"]

    # infill refusals: a 4xx in each dialect's shape
    assert "gemma" in _openai_error(await c.post("/infill", json={"model": "gemma", "input_prefix": "x"}))
    assert "input_prefix" in _openai_error(await c.post("/infill", json={"model": "coder", "prompt": "x"}))
    r = await c.post("/api/generate", json={"model": "gemma", "prompt": "x", "suffix": "y", "stream": False})
    assert r.status_code == 400 and "gemma" in r.json()["error"]
    r = await c.post("/v1/completions", json={"model": "coder", "prompt": [1, 2, 3], "suffix": "y"})
    _openai_error(r)

    # ---- rerank
    docs = ["paris is the capital of france", "the cat", "dogs run fast", "python code"]
    r = await c.post("/v1/rerank", json={"model": "ranker", "query": "what is the capital of france",
                                         "documents": docs, "top_n": 3, "return_documents": True})
    assert r.status_code == 200, r.text
    res = r.json()
    assert res["object"] == "list" and res["model"] == "ranker" and len(res["results"]) == 3
    scores = [x["relevance_score"] for x in res["results"]]
    assert scores == sorted(scores, reverse=True)
    assert all(x["document"]["text"] == docs[x["index"]] for x in res["results"])
    assert res["usage"]["prompt_tokens"] > 0 and res["usage"]["total_tokens"] == res["usage"]["prompt_tokens"]
    # TEI's shape, and no model named: the one reranker answers
    tei = (await c.post("/rerank", json={"query": "what is the capital of france", "texts": docs})).json()
    assert [x["index"] for x in tei][:3] == [x["index"] for x in res["results"]]
    assert tei[0]["score"] == pytest.approx(scores[0], abs=1e-6)
    for bad, field in [({"documents": []}, "documents"), ({"documents": ["a", ""]}, "documents"),
                       ({"documents": ["a"], "top_n": 0}, "top_n"), ({"documents": ["a"], "top_n": 2}, "top_n"),
                       ({"documents": ["a"], "query": "cat " * 1500}, "")]:
        msg = _openai_error(await c.post("/v1/rerank", json={"model": "ranker", "query": "q", **bad}))
        assert field in msg
    assert "rerank" in _openai_error(await c.post("/v1/rerank", json={"model": "gemma", "query": "q", "documents": ["a"]}))

    # ---- embeddings from a generative model (its second context)
    r = await c.post("/v1/embeddings", json={"model": "gemma", "input": ["hello world", "goodbye"]})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 2 and r.json()["usage"]["prompt_tokens"] > 0
    # one input alone, to compare with others alone (a decode of several differs in the last digits)
    vec = (await c.post("/v1/embeddings", json={"model": "gemma", "input": "hello world"})).json()["data"][0]["embedding"]
    assert len(vec) == 640 and math.isclose(math.hypot(*vec), 1.0, rel_tol=1e-4)
    r = await c.post("/v1/embeddings", json={"model": "gemma", "input": "hello world", "encoding_format": "base64"})
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(vec, abs=1e-6)
    r = await c.post("/api/embed", json={"model": "gemma", "input": ["hello world"]})
    assert r.status_code == 200 and r.json()["embeddings"][0] == pytest.approx(vec, abs=1e-6)
    r = await c.post("/api/embeddings", json={"model": "gemma", "prompt": "hello world"})
    assert r.status_code == 200 and len(r.json()["embedding"]) == 640
    long = "word " * 2000
    r = await c.post("/api/embed", json={"model": "gemma", "input": long, "truncate": False})
    assert r.status_code == 400 and "error" in r.json()
    r = await c.post("/api/embed", json={"model": "gemma", "input": long})  # truncate defaults to true
    assert r.status_code == 200 and r.json()["prompt_eval_count"] == 512
    _openai_error(await c.post("/v1/embeddings", json={"model": "gemma", "input": long}))

    # ---- inspection
    props = (await c.get("/props", params={"model": "coder"})).json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024
    assert props["bos_token"] == "<bos>" and props["infill"] is True and props["model_alias"] == "coder"
    assert (await c.get("/props")).json()["role"] == "router"  # no model named, three configured
    rank_props = (await c.get("/props", params={"model": "ranker"})).json()
    assert rank_props["pooling"] == "rank" and rank_props["embedding"] is True
    slots = (await c.get("/slots", params={"model": "coder"})).json()
    assert [s["id"] for s in slots] == [0, 1] and not any(s["is_processing"] for s in slots)  # nothing leaked
    assert all(s["n_ctx"] == 1024 for s in slots)
    assert (await c.get("/props", params={"model": "nope"})).status_code == 404
    r = await c.post("/apply-template", json={"model": "gemma", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and "hi" in r.json()["prompt"]
    _openai_error(await c.post("/apply-template", json={"model": "gemma", "messages": []}))
    r = await c.post("/detokenize", json={"model": "gemma", "tokens": [2, 9259]})
    assert r.status_code == 200 and isinstance(r.json()["content"], str)

    # after all the refusals, every model still answers
    assert (await c.post("/infill", json=greedy)).json()["content"] == first["content"]
