"""HTTP API with fake workers: responses in OpenAI's shape, and every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

from support.harness import Harness, chat


def sse_payloads(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def test_chat_completion_and_alias(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "aliases": ["x"]}})
    await harness.start(cfg)
    r = await harness.client.post("/v1/chat/completions", json=chat("x", max_tokens=3))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "a"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    assert body["timings"]["predicted_n"] == 3
    # Nitro's model_id picks the model too
    r = await harness.client.post("/v1/chat/completions",
                                  json={"model_id": "a", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    sent = harness.requests_seen("a")
    assert sent[0]["params"]["max_tokens"] == 3 and sent[0]["messages"][0]["content"] == "hi"


async def test_streaming_chat_with_usage(harness: Harness) -> None:
    await harness.serve()
    r = await harness.client.post("/v1/chat/completions",
                                  json=chat("a", stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello, world!"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_completions_stream_and_not(harness: Harness) -> None:
    await harness.serve()
    r = await harness.client.post("/v1/completions", json={"model": "a", "prompt": "Once"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hello, world!"
    assert r.json()["object"] == "text_completion"
    r = await harness.client.post("/v1/completions", json={"model": "a", "prompt": ["Once"], "stream": True})
    payloads = sse_payloads(r.text)
    assert payloads[-1] == "[DONE]"
    assert "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1]) == "Hello, world!"


async def test_embeddings_and_embedding_on_generation_model(harness: Harness) -> None:
    cfg = harness.config({"e": {"path": str(harness.script("e")), "embedding": True},
                          "g": {"path": str(harness.script("g"))}})
    await harness.start(cfg)
    r = await harness.client.post("/v1/embeddings", json={"model": "e", "input": ["ab", "abcd"]})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == [0, 1] and data[1]["embedding"][:2] == [4.0, 5.0]
    r = await harness.client.post("/v1/embeddings", json={"model": "g", "input": "x"})
    assert r.status_code == 400 and "embeddings" in r.json()["error"]["message"]


async def test_models_lists(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "aliases": ["x"]},
                          "b.c": {"path": str(harness.script("b"))}})
    await harness.start(cfg)
    r = await harness.client.get("/v1/models")
    assert {m["id"] for m in r.json()["data"]} == {"a", "b.c"}
    r = await harness.client.get("/v1/models/x")
    assert r.status_code == 200 and r.json()["id"] == "a"
    r = await harness.client.get("/models")
    entry = next(m for m in r.json()["data"] if m["id"] == "a")
    assert entry["status"]["value"] == "unloaded" and entry["aliases"] == ["x"]


async def test_bad_input_gets_clear_4xx(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}}, max_body_bytes=2000)
    c = harness.client

    async def err(r, status, code=None, param=None):  # noqa: ANN001, ANN202
        assert r.status_code == status, r.text
        e = r.json()["error"]
        assert e["message"] and "Traceback" not in r.text
        if code is not None:
            assert e["code"] == code
        if param is not None:
            assert e["param"] == param
        return e

    await err(await c.post("/v1/chat/completions", json=chat("nope")), 404, "model_not_found", "model")
    js = {"content-type": "application/json"}
    await err(await c.post("/v1/chat/completions", content=b'{"model": "a",', headers=js), 400)
    await err(await c.post("/v1/chat/completions", content=b"", headers=js), 400)
    await err(await c.post("/v1/chat/completions", content=b"[1,2]", headers=js), 400)
    # a JSON body without a JSON type (LiteLLM's ollama providers) is read as JSON; a browser's
    # cross-site types are refused
    await err(await c.post("/v1/chat/completions", content=b'{"model": "a"}'), 400, param="messages")
    await err(await c.post("/v1/chat/completions", content=b'{"model": "a"}',
                           headers={"content-type": "application/octet-stream"}), 400, param="messages")
    for cross_site in ("text/plain; charset=utf-8", "application/x-www-form-urlencoded", "multipart/form-data"):
        await err(await c.post("/v1/chat/completions", content=b'{"model": "a"}',
                               headers={"content-type": cross_site}), 415, "unsupported_media_type")
    e = await err(await c.post("/v1/chat/completions", json={"model": "a", "messages": "hi"}), 400,
                  param="messages")
    assert "messages" in e["message"]
    await err(await c.post("/v1/chat/completions", json=chat("a", max_tokens="many")), 400, param="max_tokens")
    await err(await c.post("/v1/chat/completions", json=chat("a", temperature=7)), 400, param="temperature")
    await err(await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}),
              400, param="model")
    await err(await c.post("/v1/chat/completions",
                           json={"model": "a", "messages": [{"role": "wizard", "content": "x"}]}),
              400, param="messages.0.role")
    await err(await c.post("/v1/chat/completions", json=chat("a", n=0)), 400, param="n")
    await err(await c.post("/v1/chat/completions", json=chat("a", n=17)), 400, param="n")
    await err(await c.post("/v1/chat/completions", json=chat("a", tools=[{"type": "function"}])), 400,
              param="tools.0.function")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    e = await err(await c.post("/v1/chat/completions", json=chat("a", tools=[tool], tool_choice={
        "type": "function", "function": {"name": "g"}})), 400, param="tool_choice.function.name")
    assert "'g'" in e["message"]
    await err(await c.post("/v1/chat/completions", json=chat("a", tool_choice="required")), 400, param="tool_choice")
    await err(await c.post("/v1/chat/completions", json=chat("a", top_logprobs=3)), 400, param="top_logprobs")
    await err(await c.post("/v1/chat/completions", json=chat("a", logprobs=True, top_logprobs=21)), 400,
              param="top_logprobs")
    await err(await c.post("/v1/chat/completions", json=chat("a", logit_bias={"x": 1})), 400, param="logit_bias")
    await err(await c.post("/v1/chat/completions", json=chat("a", logit_bias={"5": -101})), 400,
              param="logit_bias.5")
    e = await err(await c.post("/v1/chat/completions", json=chat("a", response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}}})), 400,
        param="response_format.json_schema.schema.properties.age.minimum")
    assert "'minimum'" in e["message"] and "not supported" in e["message"]
    await err(await c.post("/v1/chat/completions", json=chat("a", response_format={"type": "json_schema"})), 400,
              param="response_format.json_schema.schema")
    await err(await c.post("/v1/chat/completions", json=chat("a", response_format={"type": "xml"})), 400,
              param="response_format.type")
    await err(await c.post("/v1/chat/completions", json=chat("a", grammar="root ::= x", json_schema={})), 400,
              param="json_schema")
    await err(await c.post("/v1/completions", json={"model": "a", "prompt": []}), 400, param="prompt")
    await err(await c.post("/v1/completions", json={"model": "a", "prompt": [-1]}), 400)
    await err(await c.post("/v1/completions", json={"model": "a", "prompt": "x", "logprobs": 6}), 400,
              param="logprobs")
    await err(await c.post("/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 0}), 400,
              param="max_tokens")
    e = await err(await c.post("/v1/completions", json={"model": "a", "prompt": [1, 2], "suffix": "y"}), 400,
                  param="suffix")  # fill-in-the-middle takes text
    assert "text prompts" in e["message"]
    await err(await c.post("/v1/completions", json={"model": "a", "prompt": "x", "best_of": 3}), 400,
              "unsupported_option", "best_of")
    await err(await c.post("/v1/chat/completions", json=chat("a", "x" * 5000)), 413, "payload_too_large")
    await err(await c.get("/v1/nothing-here"), 404)
    await err(await c.get("/v1/chat/completions"), 405)
    await err(await c.post("/models/load", json={"model": "nope"}), 404, "model_not_found")
    await err(await c.post("/models/load", json={}), 400, param="model")
    await err(await c.delete("/models/a?force=perhaps"), 400, param="force")  # FastAPI validation: 400, not 422
    # nothing reached a worker
    assert harness.requests_seen("a") == []


async def test_chunked_body_over_limit_is_413(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}}, max_body_bytes=1000)

    async def chunks():  # noqa: ANN202
        for _ in range(10):
            yield b" " * 500

    r = await harness.client.post("/v1/chat/completions", content=chunks(),
                                  headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"


async def test_api_key(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}}, api_key="sekret")
    c = harness.client
    r = await c.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = await c.get("/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert (await c.get("/health")).status_code == 200
    r = await c.post("/v1/chat/completions", json=chat("a"), headers={"Authorization": "Bearer sekret"})
    assert r.status_code == 200


async def test_metrics_count_requests(harness: Harness) -> None:
    await harness.serve()
    assert (await harness.client.post("/v1/chat/completions", json=chat("a"))).status_code == 200
    text = (await harness.client.get("/metrics")).text
    assert 'corral_requests_total{endpoint="chat",instance="0",model="a",status="200"} 1.0' in text
    assert 'corral_completion_tokens_total{instance="0",model="a"} 4.0' in text
    assert 'corral_loads_total{instance="0",model="a"} 1.0' in text
    assert "corral_time_to_first_token_seconds_bucket" in text
    assert 'corral_slots_total{instance="0",model="a",node="local"} 4.0' in text


async def test_nitro_loadmodel_and_unloadmodel(harness: Harness) -> None:
    await harness.serve({}, allowed_model_dirs=[str(harness.tmp)])
    path = harness.script("tiny")
    r = await harness.client.post("/inferences/llamacpp/loadmodel", json={
        "model_id": "tinyllama", "llama_model_path": str(path), "ctx_len": 512, "ngl": 0,
        "embedding": False, "pre_prompt": "A chat", "user_prompt": "USER: ", "ai_prompt": "ASSISTANT: ",
        "n_parallel": 2, "cont_batching": True})
    assert r.status_code == 200, r.text
    assert harness.plane.pools["tinyllama"].has_ready
    inst = harness.plane.pools["tinyllama"].instances[0]
    assert inst.slots_total == 2 and inst.spec.user_prompt == "USER: "
    r = await harness.client.post("/v1/chat/completions",
                                  json={"model_id": "tinyllama", "messages": [{"role": "user", "content": "q"}]})
    assert r.status_code == 200
    r = await harness.client.post("/inferences/llamacpp/loadmodel",
                                  json={"model_id": "bad", "llama_model_path": str(harness.tmp / "nope.gguf")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "llama_model_path"
    r = await harness.client.post("/inferences/llamacpp/unloadmodel", json={"model_id": "tinyllama"})
    assert r.status_code == 200
    assert harness.plane.pools["tinyllama"].status() == "unloaded"


def test_router_never_imports_llama_cpp() -> None:
    code = ("import sys, corral.api.app, corral.control.plane, corral.cli.main, corral.cli.serve_cmd,"
            " corral.api.manage.store, corral.store.downloads, corral.store.local;"
            "from corral.config.file import default_config; corral.api.app.create_app(default_config());"
            "bad = [m for m in sys.modules if m.startswith('llama_cpp')];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_error_before_first_token_keeps_its_status_when_streaming(harness: Harness) -> None:
    await harness.serve()
    for stream in (True, False):
        r = await harness.client.post("/v1/chat/completions", json=chat("a", "TOOLONG", stream=stream))
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert r.json()["error"]["param"] == "messages"
    r = await harness.client.post("/v1/completions", json={"model": "a", "prompt": "TOOLONG"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt"
    assert harness.plane.pools["a"].inflight == 0


async def test_unexpected_error_is_500_without_traceback(harness: Harness) -> None:
    await harness.serve()

    async def broken(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("secret internal detail")

    harness.plane.generate = broken  # type: ignore[method-assign]
    r = await harness.client.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    assert "secret internal detail" not in r.text and "Traceback" not in r.text


class _Pull:
    def __init__(self, model_id: str) -> None:
        self.pull_id, self.model_id, self.source = "pull-1", model_id, "hf://x/y"

    def progress(self) -> dict:
        return {"pull_id": self.pull_id, "done": 5, "total": 10, "rate_bps": 1.0, "eta_s": 5.0}


class _Downloads:
    """Stands in for the store's DownloadManager (its own tests cover it)."""

    def __init__(self, pulls: list[_Pull]) -> None:
        self.pulls = pulls
        self.cancelled: list[str] = []

    def active(self) -> list[_Pull]:
        return self.pulls

    def find_by_model(self, model_id: str) -> _Pull | None:
        return next((p for p in self.pulls if p.model_id == model_id), None)

    def progress(self, model_id: str) -> dict | None:
        p = self.find_by_model(model_id)
        return p.progress() if p else None

    async def cancel(self, pull_id: str) -> bool:
        self.cancelled.append(pull_id)
        self.pulls = [p for p in self.pulls if p.pull_id != pull_id]
        return True

    async def close(self) -> None:
        pass


async def test_downloading_model_listed_and_unload_cancels(harness: Harness) -> None:
    await harness.serve()
    dm = _Downloads([_Pull("newmodel")])
    harness.app.state.downloads = dm
    models = {m["id"]: m for m in (await harness.client.get("/models")).json()["data"]}
    assert models["newmodel"]["status"]["value"] == "downloading"
    assert models["newmodel"]["status"]["progress"]["done"] == 5
    assert models["a"]["status"]["value"] == "unloaded"
    r = await harness.client.post("/models/unload", json={"model": "newmodel"})
    assert r.status_code == 200 and r.json()["success"] is True and dm.cancelled == ["pull-1"]
    models = {m["id"] for m in (await harness.client.get("/models")).json()["data"]}
    assert models == {"a"}


async def test_every_gguf_under_models_dir_is_a_model(harness: Harness) -> None:
    models_dir = harness.tmp / "models"
    (models_dir / "sub").mkdir(parents=True)
    (models_dir / "sub" / "Tiny-Q4_K_M.gguf").write_text("{}")  # the fake worker reads it as its script
    cfg = harness.config({"a": {"path": str(harness.script("a"))}}, models_dir=str(models_dir))
    plane = await harness.start(cfg, use_store=True)
    ids = {m["id"] for m in (await harness.client.get("/v1/models")).json()["data"]}
    assert ids == {"a", "Tiny-Q4_K_M"}
    assert plane.pools["Tiny-Q4_K_M"].spec.source == "store"
    r = await harness.client.post("/v1/chat/completions", json=chat("Tiny-Q4_K_M"))
    assert r.status_code == 200
    # a file dropped in later is found on reload
    (models_dir / "Later.gguf").write_text("{}")
    r = await harness.client.post("/models/reload")
    assert r.status_code == 200 and r.json()["added"] == ["Later"]
    assert "Later" in plane.pools


async def test_requests_for_a_downloading_model(harness: Harness) -> None:
    await harness.serve()
    harness.app.state.downloads = _Downloads([_Pull("newmodel")])
    r = await harness.client.post("/v1/chat/completions", json=chat("newmodel"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_downloading"
    assert "5 of 10 bytes" in r.json()["error"]["message"] and r.headers["Retry-After"] == "5"
    r = await harness.client.post("/models/load", json={"model": "newmodel"})
    assert r.status_code == 409
    r = await harness.client.post("/v1/chat/completions", json=chat("unknown"))
    assert r.status_code == 404
