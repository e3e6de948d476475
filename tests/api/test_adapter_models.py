"""Adapter model ids (``lora = [{..., model = "gemma-poet"}]``) in every model list, with their
base named, and only for the keys that see both the adapter id and its base (fake workers)."""

from __future__ import annotations

from support.harness import Harness, chat
from support.keys import bearer, write_keys_file

ADAPTER_BYTES = 4096


async def _start(harness: Harness) -> dict[str, str]:
    poet, sql = harness.tmp / "poet.gguf", harness.tmp / "sql.gguf"
    poet.write_bytes(b"\0" * ADAPTER_BYTES)
    sql.write_bytes(b"\0" * 16)
    path = harness.tmp / "keys.toml"
    secrets = write_keys_file(path, alice={"scopes": ["infer"], "models": ["gemma*"]},
                              bob={"scopes": ["infer"], "models": ["gemma"]},  # the base, not the adapter
                              carol={"scopes": ["infer"], "models": ["gemma-poet"]},  # the adapter, not the base
                              root={"scopes": ["admin"]})
    models = {"gemma": {"path": str(harness.script("gemma")),
                        "lora": [{"id": "sql", "path": str(sql), "scale": 0.5},
                                 {"id": "poet", "path": str(poet), "scale": 0.75, "model": "gemma-poet"}]},
              "other": {"path": str(harness.script("other"))}}
    await harness.start(harness.config(models, keys_file=str(path)))
    return secrets


async def _lists(harness: Harness, secret: str) -> dict[str, dict[str, dict]]:
    c = harness.client
    assert c is not None
    h = bearer(secret)
    return {
        "/v1/models": {m["id"]: m for m in (await c.get("/v1/models", headers=h)).json()["data"]},
        "/models": {m["id"]: m for m in (await c.get("/models", headers=h)).json()["data"]},
        "/api/tags": {m["name"]: m for m in (await c.get("/api/tags", headers=h)).json()["models"]},
    }


async def test_adapter_models_are_listed_with_their_base_for_the_keys_that_see_them(harness: Harness) -> None:
    secrets = await _start(harness)
    for who, ids in (("root", {"gemma", "other", "gemma-poet"}), ("alice", {"gemma", "gemma-poet"}),
                     ("bob", {"gemma"}), ("carol", set())):
        for lst, entries in (await _lists(harness, secrets[who])).items():
            assert set(entries) == ids, (who, lst)
    lists = await _lists(harness, secrets["alice"])
    v1 = lists["/v1/models"]["gemma-poet"]
    assert v1["parent"] == "gemma" and v1["adapter"]["id"] == "poet" and v1["adapter"]["scale"] == 0.75
    assert v1["vision"] is False
    router = lists["/models"]["gemma-poet"]
    assert router["adapter"] == {"base": "gemma", "id": "poet", "index": 1, "scale": 0.75,
                                 "path": str(harness.tmp / "poet.gguf")}
    assert router["status"]["value"] == lists["/models"]["gemma"]["status"]["value"] == "unloaded"
    assert router["instances"] == [] and router["in_cache"] is True
    tag, base_tag = lists["/api/tags"]["gemma-poet"], lists["/api/tags"]["gemma"]
    assert tag["details"]["parent_model"] == "gemma" and base_tag["details"]["parent_model"] == ""
    assert tag["size"] == base_tag["size"] + ADAPTER_BYTES and tag["digest"] != base_tag["digest"]


async def test_the_adapter_model_answers_show_and_get_and_runs_on_the_base(harness: Harness) -> None:
    secrets = await _start(harness)
    c = harness.client
    assert c is not None
    h = bearer(secrets["alice"])
    r = await c.get("/v1/models/gemma-poet", headers=h)
    assert r.status_code == 200 and r.json()["parent"] == "gemma"
    show = await c.post("/api/show", json={"model": "gemma-poet:latest"}, headers=h)
    assert show.status_code == 200, show.text
    body = show.json()
    assert body["details"]["parent_model"] == "gemma"
    assert f"ADAPTER {harness.tmp / 'poet.gguf'}\n" in body["modelfile"]
    assert "ADAPTER" not in (await c.post("/api/show", json={"model": "gemma"}, headers=h)).json()["modelfile"]
    r = await c.post("/v1/chat/completions", json=chat("gemma-poet"), headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "gemma"  # the base's workers answered, with the adapter alone
    (gen,) = [m for m in harness.requests_seen("gemma") if "prompt" in m or "messages" in m]
    assert gen["lora"] == [{"id": 1, "scale": 0.75}]


async def test_a_key_that_may_not_see_the_adapter_model_gets_the_unknown_models_404(harness: Harness) -> None:
    secrets = await _start(harness)
    c = harness.client
    assert c is not None
    for who in ("bob", "carol"):
        h = bearer(secrets[who])
        for method, path, body in (("POST", "/v1/chat/completions", chat("gemma-poet")),
                                   ("POST", "/api/show", {"model": "gemma-poet"}),
                                   ("GET", "/v1/models/gemma-poet", None)):
            hidden = await c.request(method, path, json=body, headers=h)
            other = path.replace("gemma-poet", "no-such-mode")
            missing = await c.request(method, other, json=body and {**body, "model": "no-such-mode"}, headers=h)
            assert hidden.status_code == missing.status_code == 404, (who, path, hidden.text)
            assert hidden.text.replace("gemma-poet", "X") == missing.text.replace("no-such-mode", "X"), (who, path)
    assert harness.requests_seen("gemma") == []
