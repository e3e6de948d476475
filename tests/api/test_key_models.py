"""Which models a key sees: absent from every dialect's model list, 404 (never 403) when named."""

from __future__ import annotations

from typing import Any

from support.harness import Harness, chat
from support.keys import bearer

MODELS = ("gemma-small", "gemma-big", "secret-model")


async def _start(harness: Harness) -> dict[str, str]:
    models = {m: {"path": str(harness.script(m))} for m in MODELS}
    models["secret-model"]["aliases"] = ["best"]
    secrets = await harness.serve(models, keys={"alice": {"scopes": ["infer", "manage"], "models": ["gemma-*"]},
                                                "carol": {"scopes": ["infer"], "models": ["best"]},  # an alias
                                                "root": {"scopes": ["admin"]}})
    c = harness.client
    for m in MODELS:  # loaded, so that /api/ps lists them
        assert (await c.post("/models/load", json={"model": m}, headers=bearer(secrets["root"]))).status_code == 200
    return secrets


async def _lists(harness: Harness, secret: str) -> dict[str, set[str]]:
    c = harness.client
    h = bearer(secret)
    return {
        "/v1/models": {m["id"] for m in (await c.get("/v1/models", headers=h)).json()["data"]},
        "/models": {m["id"] for m in (await c.get("/models", headers=h)).json()["data"]},
        "/api/tags": {m["name"] for m in (await c.get("/api/tags", headers=h)).json()["models"]},
        "/api/ps": {m["name"] for m in (await c.get("/api/ps", headers=h)).json()["models"]},
    }


async def test_model_lists_show_only_the_keys_models(harness: Harness) -> None:
    secrets = await _start(harness)
    for lst, ids in (await _lists(harness, secrets["alice"])).items():
        assert ids == {"gemma-small", "gemma-big"}, lst
    for lst, ids in (await _lists(harness, secrets["carol"])).items():
        assert ids == {"secret-model"}, lst  # allowed by its alias
    for lst, ids in (await _lists(harness, secrets["root"])).items():
        assert ids == set(MODELS), lst


def _requests(model: str) -> list[tuple[str, dict[str, Any]]]:
    return [("/v1/chat/completions", chat(model)),
            ("/v1/completions", {"model": model, "prompt": "hi"}),
            ("/v1/embeddings", {"model": model, "input": "hi"}),
            ("/v1/messages", {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/responses", {"model": model, "input": "hi"}),
            ("/api/chat", chat(model, stream=False)),
            ("/api/generate", {"model": model, "prompt": "hi", "stream": False}),
            ("/api/show", {"model": model}),
            ("/tokenize", {"model": model, "content": "hi"}),
            ("/models/load", {"model": model}),
            ("/models/unload", {"model": model})]


async def test_a_hidden_model_is_not_found_as_if_it_did_not_exist(harness: Harness) -> None:
    secrets = await _start(harness)
    c = harness.client
    h = bearer(secrets["alice"])
    for path, body in _requests("secret-model"):
        hidden = await c.post(path, json=body, headers=h)
        missing = await c.post(path, json={**body, "model": "no-such-mode"}, headers=h)
        assert hidden.status_code == 404, (path, hidden.status_code, hidden.text)
        assert missing.status_code == 404, (path, missing.text)
        # the same answer, word for word but the name: nothing tells a hidden model from none
        assert hidden.text.replace("secret-model", "X") == missing.text.replace("no-such-mode", "X"), path
    for alias in ("best", "secret-model:latest"):
        r = await c.post("/v1/chat/completions", json=chat(alias), headers=h)
        assert r.status_code == 404, alias
    r = await c.get("/v1/models/secret-model", headers=h)
    assert r.status_code == 404
    r = await c.get("/models/show", params={"model": "secret-model"}, headers=h)
    assert r.status_code == 404
    # the dialects' own 404 shapes
    r = await c.post("/v1/messages", json=_requests("secret-model")[3][1], headers=h)
    assert r.json()["error"]["type"] == "not_found_error"
    r = await c.post("/api/chat", json=chat("secret-model", stream=False), headers=h)
    assert "not found" in r.json()["error"]
    # what the key may use works, and the others still see the hidden model
    assert (await c.post("/v1/chat/completions", json=chat("gemma-big"), headers=h)).status_code == 200
    assert (await c.get("/v1/models/gemma-big", headers=h)).status_code == 200
    r = await c.post("/v1/chat/completions", json=chat("best"), headers=bearer(secrets["carol"]))
    assert r.status_code == 200 and r.json()["model"] == "secret-model"
    assert harness.plane.pools["secret-model"].status() == "loaded"  # alice's unload did nothing
