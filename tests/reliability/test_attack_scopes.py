"""Attacks of a hostile colleague holding one key (issue 33, parts 2, 3 and 5), replayed:

- an ``infer`` key unloading or pinning a shared model through Ollama's ``keep_alive``;
- a ``manage`` key limited to one model taking over names it cannot see (``/api/copy``,
  Nitro's ``loadmodel``): an adapter model's id, another key's model;
- a key's token limits multiplied by concurrency (the real model: the worker enforces
  the budget), and ``GET /tokenizer_info`` loading a model outside every limit (a GET now
  loads nothing).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support.harness import Harness, _until, chat
from support.keys import bearer, write_keys_file

KEEP_ALIVE_IGNORED = "X-Corral-Keep-Alive-Ignored"  # corral.api.ollama.routes, as documented


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({}))  # the fake worker reads it as its script
    return path


# ------------------------------------------------------------------ keep_alive


async def test_an_infer_key_cannot_unload_or_pin_a_shared_model(harness: Harness) -> None:
    path = harness.tmp / "keys.toml"
    secrets = write_keys_file(path, user={"scopes": ["infer"]}, ops={"scopes": ["infer", "manage"]})
    await harness.serve({"a": {"path": str(harness.script("a"))},
                         "e": {"path": str(harness.script("e")), "embedding": True}},
                        keys_file=str(path))
    c = harness.client
    user, ops = bearer(secrets["user"]), bearer(secrets["ops"])
    pool = harness.plane.pools["a"]
    r = await c.post("/api/generate", json={"model": "a", "prompt": "hi", "stream": False}, headers=user)
    assert r.status_code == 200 and KEEP_ALIVE_IGNORED not in r.headers  # no keep_alive: nothing to say
    assert pool.status() == "loaded"
    # unloading (an empty prompt with keep_alive 0): ignored, said so; the model stays
    r = await c.post("/api/generate", json={"model": "a", "keep_alive": 0}, headers=user)
    assert r.status_code == 200 and "manage" in r.headers[KEEP_ALIVE_IGNORED]
    assert r.json()["done_reason"] == "load"
    # pinning (-1) and any other lifetime, streamed or not, on every Ollama route
    for route, body in (("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False}),
                        ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
                        ("/api/generate", {"prompt": "hi"}), ("/api/embed", {"model": "e", "input": "hi"}),
                        ("/api/embeddings", {"model": "e", "prompt": "hi"})):
        for ka in (-1, "-1m", "24h"):
            r = await c.post(route, json={"model": "a", **body, "keep_alive": ka}, headers=user)
            assert r.status_code == 200 and KEEP_ALIVE_IGNORED in r.headers, (route, ka)
    for p in harness.plane.pools.values():
        assert p.keep_alive_s is None and not p.pinned and p.status() == "loaded", p.spec.id
    # a manage key still may
    r = await c.post("/api/generate", json={"model": "a", "keep_alive": -1}, headers=ops)
    assert r.status_code == 200 and KEEP_ALIVE_IGNORED not in r.headers and pool.pinned
    r = await c.post("/api/generate", json={"model": "a", "keep_alive": 0}, headers=ops)
    assert r.json()["done_reason"] == "unload" and pool.status() == "unloaded"


# ------------------------------------------------------------------ names


async def test_a_manage_key_cannot_take_over_names_it_cannot_see(harness: Harness, tmp_path: Path) -> None:
    adapter = harness.tmp / "poet.gguf"
    adapter.write_bytes(b"\0" * 64)
    nitro_file = _script(tmp_path / "allowed" / "n.gguf")
    path = harness.tmp / "keys.toml"
    secrets = write_keys_file(path, mallory={"scopes": ["infer", "manage"], "models": ["gemma*"]},
                              alice={"scopes": ["infer"], "models": ["gemma*", "private*"]},
                              bob={"scopes": ["infer"], "models": ["private"]})
    models = {"gemma": {"path": str(harness.script("gemma")),
                        "lora": [{"id": "poet", "path": str(adapter), "scale": 0.5, "model": "gemma-poet"}]},
              "private": {"path": str(harness.script("private"))}}
    await harness.serve(models, keys_file=str(path), allowed_model_dirs=[str(nitro_file.parent)])
    c = harness.client
    m = bearer(secrets["mallory"])
    # the adapter model's id, bare or with :latest: 409 in Ollama's shape
    for name in ("gemma-poet", "gemma-poet:latest"):
        r = await c.post("/api/copy", json={"source": "gemma", "destination": name}, headers=m)
        assert r.status_code == 409 and set(r.json()) == {"error"} and "already the name" in r.json()["error"]
    # names outside the key's patterns (another key's model, a name for later): 403, nothing learned
    for name in ("private", "private-2", "x"):
        r = await c.post("/api/copy", json={"source": "gemma", "destination": name}, headers=m)
        assert r.status_code == 403 and set(r.json()) == {"error"} and "may use" in r.json()["error"], name
    # Nitro's loadmodel: the same, in its (OpenAI) shape
    for name, status in (("gemma-poet", 409), ("private-2", 403)):
        r = await c.post("/inferences/llamacpp/loadmodel",
                         json={"model_id": name, "llama_model_path": str(nitro_file)}, headers=m)
        assert r.status_code == status and r.json()["error"]["param"] == "model_id", name
    assert set(harness.plane.pools) == {"gemma", "private"}
    assert harness.plane.pools["gemma"].spec.aliases == ()
    # the other keys are served what they were before
    a = bearer(secrets["alice"])
    ids = {e["id"] for e in (await c.get("/v1/models", headers=a)).json()["data"]}
    assert ids == {"gemma", "gemma-poet", "private"}
    r = await c.post("/v1/chat/completions", json=chat("gemma-poet"), headers=a)
    assert r.status_code == 200
    (gen,) = [m for m in harness.requests_seen("gemma") if "prompt" in m or "messages" in m]
    assert gen["lora"] == [{"id": 0, "scale": 0.5}]  # still the adapter, not a copy of the bare base
    r = await c.post("/v1/chat/completions", json=chat("private"), headers=bearer(secrets["bob"]))
    assert r.status_code == 200 and r.json()["model"] == "private"
    # a name of its own still works
    r = await c.post("/api/copy", json={"source": "gemma", "destination": "gemma-mine"}, headers=m)
    assert r.status_code == 200 and harness.plane.resolve("gemma-mine") == "gemma"


# ------------------------------------------------------------------ token limits


@pytest.mark.integration
async def test_concurrency_cannot_multiply_a_token_limit(harness: Harness, model_path: Path) -> None:
    path = harness.tmp / "keys.toml"
    secrets = write_keys_file(path, small={"tpd": 150}, minute={"tpm": 150}, other={"tpd": 100000})
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 2048, "n_parallel": 8, "threads": 1}},
                         keys_file=str(path), worker_command=None)
    await harness.start(cfg)
    c = harness.client
    body = {"model": "gemma", "messages": [{"role": "user", "content": "Count from one to one hundred."}],
            "temperature": 0, "ignore_eos": True}
    for name in ("small", "minute"):
        h = bearer(secrets[name])
        answers = await asyncio.gather(*(c.post("/v1/chat/completions", json=body, headers=h) for _ in range(8)))
        ok = [r for r in answers if r.status_code == 200]
        assert ok and all(r.status_code in (200, 429) for r in answers), [r.text for r in answers]
        assert all(r.json()["error"]["type"] == "tokens" for r in answers if r.status_code == 429)
        assert any(r.json()["choices"][0]["finish_reason"] == "length" for r in ok)  # cut at the budget
        await _until(lambda: sum(r["prompt_tokens"] + r["completion_tokens"]
                                 for r in harness.plane.access.usage.query(key=name)) > 0)
        used = sum(r["prompt_tokens"] + r["completion_tokens"] for r in harness.plane.access.usage.query(key=name))
        charged = sum(r.json()["usage"]["total_tokens"] for r in ok)
        assert used == charged <= 150, (name, used)
    # a key with room is not touched by the others' limits
    r = await c.post("/v1/chat/completions", json={**body, "max_tokens": 4}, headers=bearer(secrets["other"]))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


async def test_tokenizer_info_loads_nothing_and_is_admitted_like_every_model_request(harness: Harness) -> None:
    """It was a GET that loaded a model outside every limit; now it answers from the loaded
    instance's report alone: no load, no worker asked (issue 45); the key's limits still apply."""
    path = harness.tmp / "keys.toml"
    secrets = write_keys_file(path, one={"concurrency": 1, "queue": 0})
    await harness.serve({"a": {"path": str(harness.script("a"))}}, keys_file=str(path))
    c = harness.client
    pool = harness.plane.pools["a"]
    h = bearer(secrets["one"])
    for method in ("GET", "HEAD"):
        r = await c.request(method, "/tokenizer_info", params={"model": "a"}, headers=h)
        assert r.status_code == (400 if method == "GET" else 405), method  # model_not_loaded; HEAD has no route
    assert pool.status() == "unloaded"
    assert harness.requests_seen("a") == []
    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "FOREVER", stream=True), headers=h) as s:
        assert (await anext(s.aiter_lines())).startswith("data: ")
        r = await c.get("/tokenizer_info", params={"model": "a"}, headers=h)
        assert r.status_code == 429 and "in flight" in r.text  # still admitted as the key's requests are
