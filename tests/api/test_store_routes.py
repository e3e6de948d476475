"""The store routes over the real control plane (tests/store uses a stand-in): what they
need of it is ``corral.api.manage.store.ModelHolder``."""

from __future__ import annotations

from support.harness import Harness, chat


async def test_delete_a_loaded_store_model_through_the_plane(harness: Harness) -> None:
    models = harness.tmp / "models"
    models.mkdir()
    (models / "here.gguf").write_text("{}")  # the fake worker's script: the defaults
    cfg = harness.config({}, models_dir=str(models))
    plane = await harness.start(cfg, use_store=True)
    c = harness.client
    assert (await c.post("/v1/chat/completions", json=chat("here"))).status_code == 200
    assert plane.is_loaded("here")
    r = await c.delete("/models/here")
    assert r.status_code == 409 and "is loaded" in r.json()["error"]["message"], r.text
    assert (models / "here.gguf").exists() and plane.is_loaded("here")
    async with plane.bus.subscribe() as q:
        r = await c.delete("/models/here", params={"force": "true"})
        assert r.status_code == 200 and r.json()["deleted"] is True, r.text
        events = [q.get_nowait()["event"] for _ in range(q.qsize())]
    assert "model_removed" in events
    assert not (models / "here.gguf").exists() and "here" not in plane.pools and "here" not in plane.catalog
    assert (await c.post("/v1/chat/completions", json=chat("here"))).status_code == 404


async def test_store_routes_without_a_store_are_404_not_500(harness: Harness) -> None:
    await harness.serve({})  # use_store=False: no store, no downloads
    c = harness.client
    for method, path in [("GET", "/models/pull/p1"), ("DELETE", "/models/pull/p1"), ("DELETE", "/models/x"),
                         ("POST", "/models/pull"), ("DELETE", "/api/delete")]:
        body = {"model": "o/r/f.gguf"} if method == "POST" else ({"model": "x"} if path == "/api/delete" else None)
        r = await c.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert ("not found" if path == "/api/delete" else "no model store") in r.text
