"""Adapter model ids (``lora = [{..., model = "gemma-poet"}]``) in every model list, with their
base named, and only for the keys that see both the adapter id and its base (fake workers)."""

from __future__ import annotations

from support.harness import Harness, chat
from support.keys import bearer

ADAPTER_BYTES = 4096


async def _start(harness: Harness) -> dict[str, str]:
    poet, sql = harness.tmp / "poet.gguf", harness.tmp / "sql.gguf"
    poet.write_bytes(b"\0" * ADAPTER_BYTES)
    sql.write_bytes(b"\0" * 16)
    models = {"gemma": {"path": str(harness.script("gemma")),
                        "lora": [{"id": "sql", "path": str(sql), "scale": 0.5},
                                 {"id": "poet", "path": str(poet), "scale": 0.75, "model": "gemma-poet"}]},
              "other": {"path": str(harness.script("other"))}}
    return await harness.serve(models, keys={"alice": {"scopes": ["infer"], "models": ["gemma*"]},
                                             "bob": {"scopes": ["infer"], "models": ["gemma"]},  # the base, not the adapter
                                             "carol": {"scopes": ["infer"], "models": ["gemma-poet"]},  # the adapter only
                                             "root": {"scopes": ["admin"]}})


async def _lists(harness: Harness, secret: str) -> dict[str, dict[str, dict]]:
    c = harness.client
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


async def test_loading_and_unloading_an_adapter_model_act_on_its_base_and_ps_lists_it(harness: Harness) -> None:
    secrets = await _start(harness)
    c = harness.client
    root, alice = bearer(secrets["root"]), bearer(secrets["alice"])

    async def ps(h: dict[str, str]) -> dict[str, dict]:
        return {m["name"]: m for m in (await c.get("/api/ps", headers=h)).json()["models"]}

    async def status(model: str) -> str:
        return {m["id"]: m for m in (await c.get("/models", headers=root)).json()["data"]}[model]["status"]["value"]

    assert await ps(root) == {}
    r = await c.post("/models/load", json={"model": "gemma-poet"}, headers=root)
    assert r.status_code == 200 and r.json() == {"success": True, "base": "gemma"}, r.text
    assert await status("gemma") == "loaded" and await status("other") == "unloaded"
    listed = await ps(alice)
    assert set(listed) == {"gemma", "gemma-poet"}
    assert listed["gemma-poet"]["details"]["parent_model"] == "gemma"
    assert listed["gemma-poet"]["size"] == listed["gemma"]["size"] > 0
    assert set(await ps(bearer(secrets["bob"]))) == {"gemma"}
    r = await c.post("/models/unload", json={"model": "gemma-poet"}, headers=root)
    assert r.status_code == 200 and r.json() == {"success": True, "base": "gemma"}, r.text
    assert await status("gemma") == "unloaded" and await ps(root) == {}

    # Ollama's load and unload: an empty prompt, then keep_alive 0, both named by the adapter id
    r = await c.post("/api/generate", json={"model": "gemma-poet"}, headers=alice)
    assert r.status_code == 200 and r.json()["model"] == "gemma-poet" and r.json()["done_reason"] == "load", r.text
    assert await status("gemma") == "loaded"
    r = await c.post("/api/generate", json={"model": "gemma-poet", "keep_alive": 0}, headers=alice)
    assert r.json()["done_reason"] == "load" and await status("gemma") == "loaded"  # unloading needs manage
    r = await c.post("/api/generate", json={"model": "gemma-poet", "keep_alive": 0}, headers=root)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
    assert await status("gemma") == "unloaded"

    r = await c.post("/models/load", json={"model": "gemma-nope"}, headers=root)
    assert r.status_code == 404, r.text
    assert harness.requests_seen("gemma") == []  # nothing was generated on the way
