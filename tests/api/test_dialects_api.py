"""Ollama, Anthropic and Responses routes with fake workers: malformed bodies get a 4xx in
that API's own error shape (never a 5xx), the translations reach the worker as the same
wire request, and "try again later" is 529 overloaded_error on Anthropic's routes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from support.harness import Harness
from support.harness import _until

POSTS = ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show", "/api/pull",
         "/api/copy", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]
BAD_BODIES: list[bytes] = [b"", b"not json", b"[1, 2]", b"{}", b'{"model": 5}',
                           b'{"model": ""}', b'{"model": ["a"], "stream": "maybe"}']
JSON = {"Content-Type": "application/json"}


def assert_shape(path: str, body: Any) -> None:
    if path.startswith("/api/"):
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    elif path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"], body


async def test_malformed_bodies_get_4xx_in_each_apis_shape(harness: Harness) -> None:
    await harness.serve()
    c = harness.client
    for path in POSTS:
        for raw in BAD_BODIES:
            r = await c.post(path, content=raw, headers=JSON)
            assert 400 <= r.status_code < 500, (path, raw, r.status_code, r.text)
            assert_shape(path, r.json())
    for raw in BAD_BODIES:
        r = await c.request("DELETE", "/api/delete", content=raw, headers=JSON)
        assert 400 <= r.status_code < 500 and set(r.json()) == {"error"}, (raw, r.text)
    # unknown routes and methods answer in the shape of the API they belong to
    r = await c.get("/api/nope")
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = await c.get("/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    assert (await c.get("/api/version")).json()["version"]


@pytest.mark.parametrize(("path", "body", "words"), [
    ("/api/generate", {"model": "a", "prompt": "x", "keep_alive": "5 minutes"}, "keep_alive"),
    ("/api/generate", {"model": "a", "prompt": "x", "images": ["aGk="]}, "images"),
    ("/api/generate", {"model": "a", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/chat", {"model": "a", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ("/api/chat", {"model": "a", "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ("/api/chat", {"model": "a", "messages": [{"role": "user", "content": "x"}], "options": {"top_p": 3}},
     "top_p"),
    ("/v1/messages", {"model": "a", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ("/v1/messages", {"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "image"),
    ("/v1/messages", {"model": "a", "max_tokens": 5, "temperature": 1.5,
                      "messages": [{"role": "user", "content": "x"}]}, "temperature"),
    ("/v1/responses", {"model": "a", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input_image"),
    ("/v1/responses", {"model": "a", "input": []}, "input"),
])
async def test_bad_values_name_the_field(harness: Harness, path: str, body: dict[str, Any], words: str) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "ctx_len": 1024}})
    r = await harness.client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert_shape(path, r.json())
    assert words in r.text


async def test_unknown_model_is_404_in_each_shape(harness: Harness) -> None:
    await harness.serve()
    c = harness.client
    r = await c.post("/api/chat", json={"model": "zz", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and "zz" in r.json()["error"]
    r = await c.post("/api/show", json={"model": "zz"})
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = await c.post("/v1/messages", json={"model": "zz", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = await c.post("/v1/responses", json={"model": "zz", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_translations_reach_the_worker_as_one_wire_request(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "ctx_len": 1024, "n_parallel": 2}})
    c = harness.client
    r = await c.post("/api/generate", json={"model": "a", "prompt": "P", "system": "S", "stream": False,
                                            "options": {"num_predict": 7, "temperature": 0.5, "top_k": 3,
                                                        "repeat_last_n": -1, "stop": ["\n"], "seed": 9}})
    assert r.status_code == 200 and r.json()["response"] == "Hello, world!" and r.json()["done"]
    r = await c.post("/api/generate", json={"model": "a", "prompt": "RAW", "raw": True, "stream": False,
                                            "options": {"num_predict": -1}})
    r = await c.post("/v1/messages", json={"model": "a", "max_tokens": 5, "system": [{"type": "text", "text": "S"}],
                                           "stop_sequences": ["!"], "top_k": 2,
                                           "messages": [{"role": "user", "content": "Q"}]})
    assert r.json()["content"] == [{"type": "text", "text": "Hello, world!"}]
    r = await c.post("/v1/responses", json={"model": "a", "input": "R", "instructions": "I",
                                            "max_output_tokens": 4, "top_p": 0.5})
    assert r.json()["output"][0]["content"][0]["text"] == "Hello, world!"
    seen = harness.requests_seen("a")
    first, raw, anth, resp = seen[0], seen[1], seen[2], seen[3]
    assert first["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "P"}]
    p = first["params"]
    assert (p["max_tokens"], p["temperature"], p["top_k"], p["repeat_last_n"], p["stop"], p["seed"]) == (
        7, 0.5, 3, 512, ["\n"], 9)
    assert raw["prompt"] == "RAW" and raw["params"]["max_tokens"] is None
    assert anth["messages"][0] == {"role": "system", "content": "S"}
    assert anth["params"]["stop"] == ["!"] and anth["params"]["top_k"] == 2 and anth["params"]["max_tokens"] == 5
    assert resp["messages"] == [{"role": "system", "content": "I"}, {"role": "user", "content": "R"}]
    assert resp["params"]["max_tokens"] == 4 and resp["params"]["top_p"] == 0.5
    # every dialect is counted in the same request metric, with its own endpoint label
    metrics = (await c.get("/metrics")).text
    for endpoint in ("ollama_generate", "anthropic_messages", "responses"):
        assert f'endpoint="{endpoint}"' in metrics


async def test_queue_full_is_529_overloaded_on_anthropic_routes(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1}}, max_queue=0)
    plane = await harness.start(cfg)
    c = harness.client
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)
        r = await c.post("/v1/messages", json={"model": "a", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 529 and int(r.headers["Retry-After"]) >= 1
        assert r.json() == {"type": "error", "error": {"type": "overloaded_error", "message": r.json()["error"]["message"]}}
        r = await c.post("/api/generate", json={"model": "a", "prompt": "x"})
        assert r.status_code == 503 and "Retry-After" in r.headers and set(r.json()) == {"error"}


async def test_streams_end_with_each_apis_terminal_event_and_abort_on_disconnect(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "n_parallel": 1}})
    plane = harness.plane
    c = harness.client
    r = await c.post("/api/chat", json={"model": "a", "messages": [{"role": "user", "content": "x"}]})
    lines = [json.loads(x) for x in r.text.strip().split("\n")]
    assert r.headers["content-type"].startswith("application/x-ndjson") and len(lines) >= 2
    assert "".join(x["message"]["content"] for x in lines) == "Hello, world!"
    assert [x["done"] for x in lines] == [False] * (len(lines) - 1) + [True]
    assert lines[-1]["done_reason"] == "stop" and lines[-1]["eval_count"] == 4
    r = await c.post("/v1/messages", json={"model": "a", "max_tokens": 4, "stream": True,
                                           "messages": [{"role": "user", "content": "x"}]})
    assert r.text.rstrip().endswith('data: {"type":"message_stop"}')
    # a client that leaves mid-stream frees the slot, whatever the dialect
    for path, body in (("/api/generate", {"model": "a", "prompt": "FOREVER"}),
                       ("/v1/messages", {"model": "a", "max_tokens": 4000, "stream": True,
                                         "messages": [{"role": "user", "content": "FOREVER"}]}),
                       ("/v1/responses", {"model": "a", "input": "FOREVER", "stream": True}),
                       ("/v1/chat/completions", {"model": "a", "stream": True,
                                                 "messages": [{"role": "user", "content": "FOREVER"}]}),
                       ("/v1/completions", {"model": "a", "prompt": "FOREVER", "stream": True})):
        async with c.stream("POST", path, json=body) as s:
            async for _ in s.aiter_bytes():
                break
        await _until(lambda: plane.pools["a"].inflight == 0)


async def test_ids_with_slash_and_colon_in_every_route(harness: Harness) -> None:
    mid = "org/model-GGUF:Q4_K_M"
    await harness.serve({mid: {"path": str(harness.script("a")), "aliases": ["m:latest"]}})
    plane = harness.plane
    c = harness.client
    assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == [mid]
    assert [m["id"] for m in (await c.get("/models")).json()["data"]] == [mid]
    assert (await c.get(f"/v1/models/{mid}")).json()["id"] == mid
    r = await c.post("/v1/chat/completions", json={"model": mid, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["model"] == mid
    r = await c.post("/api/generate", json={"model": "m", "prompt": "x", "stream": False})  # m -> m:latest
    assert r.status_code == 200 and r.json()["model"] == mid
    assert (await c.post("/models/unload", json={"model": mid})).status_code == 200
    assert (await c.post("/api/show", json={"model": mid})).status_code == 200
    r = await c.post("/api/copy", json={"source": mid, "destination": "short"})
    assert r.status_code == 200 and plane.resolve("short") == mid
    r = await c.post("/api/copy", json={"source": mid, "destination": "../x"})
    assert r.status_code == 400 and ("destination" in r.json()["error"] or "invalid" in r.json()["error"])
    assert (await c.post("/v1/messages", json={"model": "short", "max_tokens": 3, "messages": [
        {"role": "user", "content": "x"}]})).json()["model"] == mid
    # the worker's log file is named by the id's safe file stem, not by the id
    assert (harness.tmp / "logs" / "org%2Fmodel-GGUF%3AQ4_K_M.0.log").exists()


async def test_ollama_num_ctx_sizes_the_chat_as_ollama_does(harness: Harness) -> None:
    """aider sends num_ctx = prompt x 1.25 + 8192: taken within the slot, never a 400; a chat
    over it loses its oldest turns (system and last message kept), or is refused with
    truncate: false; a context under the slot caps the tokens generated."""
    await harness.serve({"a": {"path": str(harness.script("a")), "ctx_len": 4096, "n_parallel": 1}})
    c = harness.client
    turns = [{"role": "system", "content": "be brief"}]
    for i in range(6):
        turns += [{"role": "user", "content": f"question {i} " + "word " * 10},
                  {"role": "assistant", "content": f"answer {i} " + "word " * 10}]
    turns.append({"role": "user", "content": "last one"})
    body = {"model": "a", "stream": False, "messages": turns}
    r = await c.post("/api/chat", json={**body, "options": {"num_ctx": 100000}})
    assert r.status_code == 200, r.text
    assert len(harness.requests_seen("a")[-1]["messages"]) == len(turns)
    r = await c.post("/api/chat", json={**body, "options": {"num_ctx": 40, "num_predict": 500}})
    assert r.status_code == 200, r.text
    seen = [x for x in harness.requests_seen("a") if "messages" in x and "params" in x][-1]
    contents = [m["content"] for m in seen["messages"]]
    assert contents[0] == "be brief" and contents[-1] == "last one" and len(contents) < len(turns)
    assert "question 0" not in " ".join(contents)  # the oldest went first
    n_prompt = len(" ".join(contents).split())  # the fake worker's tokens: words
    assert n_prompt < 40 and seen["params"]["max_tokens"] == 40 - n_prompt
    r = await c.post("/api/chat", json={**body, "truncate": False, "options": {"num_ctx": 40}})
    assert r.status_code == 400 and "40 tokens" in r.json()["error"], r.text
    r = await c.post("/api/chat", json={"model": "a", "stream": False, "options": {"num_ctx": 3},
                                        "messages": [{"role": "user", "content": "far too many words here"}]})
    assert r.status_code == 400 and "last message" in r.json()["error"], r.text
