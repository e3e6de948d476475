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
