"""The LiteLLM proxy (1.108.7) in front of corral: the requests it sent for an ``openai/``, an
``ollama_chat/`` and an ``ollama/`` deployment (tests/fixtures/clients/litellm_proxy/, recorded
by capture.py there), replayed as they came (method, path, Content-Type, body) against a real
router, worker and the embedded model; each is answered 2xx in the shape the proxy reads
(for ``ollama_chat/``: litellm/llms/ollama/chat/transformation.py, every stream line's
``message`` and ``done``, the counts on the last, a call's ``arguments`` as an object).

The tool-call recordings ask with the call's own JSON as the user text at temperature 0, which
the model repeats; ``tool_choice: "required"`` (forwarded by ``openai/`` only) forces one.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients" / "litellm_proxy"
MODEL = "gemma-3-270m"  # the model's id in the proxy's config.yaml when recorded
TOOL = "get_weather"


def _recorded() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.json"))


async def _send(c: httpx.AsyncClient, name: str) -> tuple[dict[str, Any], httpx.Response]:
    rec: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    headers = {"content-type": rec["headers"]["content-type"]} if "content-type" in rec["headers"] else {}
    content = json.dumps(rec["body"]).encode() if rec["body"] is not None else None
    r = await c.request(rec["method"], rec["path"], content=content, headers=headers, timeout=300)
    assert 200 <= r.status_code < 300, (name, r.status_code, r.text)
    return rec, r


def _sse(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-3:]
    return [json.loads(d) for d in data[:-1]]


def _ndjson(r: httpx.Response) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    assert all(line["done"] is False for line in lines[:-1]) and lines[-1]["done"] is True, lines
    return lines


def _check_openai_call(call: dict[str, Any]) -> None:
    assert call["type"] == "function" and call["id"] and call["function"]["name"] == TOOL, call
    assert isinstance(json.loads(call["function"]["arguments"])["city"], str), call


def _check_openai(name: str, body: dict[str, Any], r: httpx.Response) -> None:
    if name == "models":
        assert MODEL in [m["id"] for m in r.json()["data"]]
    elif name.startswith("openai_embeddings"):
        data = r.json()["data"]
        assert body["encoding_format"] == "base64" and len(data) == len(body["input"])
        assert all(len(base64.b64decode(d["embedding"])) % 4 == 0 and d["embedding"] for d in data)
    elif name.startswith("openai_completion"):
        if body.get("stream"):
            chunks = _sse(r)
            assert all(ch["object"] == "text_completion" for ch in chunks)
            assert "".join(ch["choices"][0]["text"] for ch in chunks if ch["choices"])
        else:
            assert r.json()["choices"][0]["text"] and r.json()["usage"]["completion_tokens"] > 0
    elif body.get("stream"):
        chunks = _sse(r)
        assert all(ch["object"] == "chat.completion.chunk" and ch["model"] == MODEL for ch in chunks)
        choices = [ch["choices"][0] for ch in chunks if ch["choices"]]
        calls = [tc for ch in choices for tc in ch["delta"].get("tool_calls") or []]
        if body.get("tool_choice") == "required" or "tool_call" in name:
            assert choices[-1]["finish_reason"] == "tool_calls", choices
            assert calls[0]["index"] == 0
            _check_openai_call(calls[0])
        else:
            assert choices[-1]["finish_reason"] in ("stop", "length")
            assert "".join(ch["delta"].get("content") or "" for ch in choices)
        if body.get("stream_options", {}).get("include_usage"):
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0
    else:
        answer = r.json()
        choice = answer["choices"][0]
        assert answer["object"] == "chat.completion" and answer["usage"]["prompt_tokens"] > 0
        if name == "openai_tool_call":
            assert choice["finish_reason"] == "tool_calls"
            _check_openai_call(choice["message"]["tool_calls"][0])
        else:
            assert choice["finish_reason"] in ("stop", "length", "tool_calls"), choice
            assert choice["message"]["content"] or choice["message"].get("tool_calls"), choice


def _check_ollama(name: str, body: dict[str, Any], r: httpx.Response) -> None:
    if name == "ollama_embed":
        vectors = r.json()["embeddings"]
        assert len(vectors) == len(body["input"]) and all(len(v) == len(vectors[0]) > 0 for v in vectors)
        return
    lines = _ndjson(r) if body["stream"] else [r.json()]
    last = lines[-1]
    assert last["done"] is True and last["done_reason"] in ("stop", "length"), last
    assert isinstance(last["prompt_eval_count"], int) and isinstance(last["eval_count"], int), last
    if r.request.url.path == "/api/generate":
        assert "".join(line["response"] for line in lines)
        return
    assert all(line["message"]["role"] == "assistant" for line in lines)
    calls = [tc for line in lines for tc in line["message"].get("tool_calls") or []]
    if "tool_call" in name:
        assert calls and calls[0]["function"]["name"] == TOOL, lines
        args = calls[0]["function"]["arguments"]
        assert isinstance(args, dict) and isinstance(args.get("city"), str), calls  # an object, not text
    elif not calls:
        assert "".join(line["message"]["content"] for line in lines), lines


async def test_litellm_proxy_requests_are_answered_in_the_shape_it_reads(harness: Harness,
                                                                        model_path: Path) -> None:
    cfg = harness.config({MODEL: {"path": str(model_path), "ctx_len": 2048, "n_parallel": 1, "threads": 2}},
                         worker_command=None, queue_timeout_s=300.0, load_timeout_s=120.0)
    await harness.start(cfg)
    c = harness.client
    names = _recorded()
    assert len(names) == 23 and {n.split("_")[0] for n in names} == {"models", "openai", "ollama"}
    for name in names:
        rec, r = await _send(c, name)
        if rec["path"] in ("/api/chat", "/api/generate"):  # JSON, typed as LiteLLM types it
            assert rec["headers"]["content-type"] == "application/octet-stream"
        if rec["path"].startswith("/api/"):
            _check_ollama(name, rec["body"], r)
        else:
            _check_openai(name, rec["body"] or {}, r)
