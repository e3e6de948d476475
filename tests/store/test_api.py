"""The store's HTTP routes through a FastAPI app (ASGI, no socket)."""

from __future__ import annotations

import httpx
import pytest

from corral.events import EventBus
from corral.store.local import ModelStore

from .conftest import small_gguf
from .fake_hub import FakeHub
from .store_app import FakeRouter, make_app

REPO = "me/api-GGUF"


@pytest.fixture
async def client(store: ModelStore, bus: EventBus):
    router = FakeRouter()
    app = make_app(store, bus, router)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://corral") as c:
        c.app = app  # type: ignore[attr-defined]
        c.router = router  # type: ignore[attr-defined]
        yield c
    await app.state.downloads.close()


async def test_pull_returns_202_and_finishes(hub: FakeHub, client: httpx.AsyncClient,
                                             store: ModelStore) -> None:
    hub.add(f"{REPO}/a-Q8_0.gguf", small_gguf(60_000))
    r = await client.post("/models/pull", json={"model": f"{REPO}/a-Q8_0.gguf"})
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["id"].startswith("pull-") and body["model"] == "a-Q8_0"
    await client.app.state.downloads.get(body["id"]).wait()  # type: ignore[attr-defined]
    st = (await client.get(f"/models/pull/{body['id']}")).json()
    assert st["status"] == "finished" and st["done"] == 60_000
    assert store.get("a-Q8_0") is not None
    # POST /models is the same thing, llama.cpp style; "id" names the model
    hub.add(f"{REPO}/b.gguf", small_gguf(10_000, seed=9))
    r = await client.post("/models", json={"model": f"{REPO}/b.gguf", "id": "bee"})
    assert r.status_code == 202 and r.json()["model"] == "bee"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": "o/r/f.gguf", "extra": 1}, "extra", "Extra inputs"),
        ({}, "model", "Field required"),
        ({"model": "no good"}, "model", "cannot read model source"),
        ({"model": "o/r/f.gguf", "sha256": "123"}, "sha256", "64 hex"),
        ({"model": "o/r/f.gguf", "id": "a/../b"}, "id", "invalid model id"),
        ([1, 2], None, "JSON object"),
    ],
)
async def test_bad_pull_bodies_are_400(client: httpx.AsyncClient, body: object,
                                       param: str | None, words: str) -> None:
    r = await client.post("/models/pull", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert words in err["message"]


async def test_not_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/models/pull", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


async def test_hub_404_is_404(hub: FakeHub, client: httpx.AsyncClient) -> None:
    r = await client.post("/models/pull", json={"model": f"{REPO}/absent.gguf"})
    assert r.status_code == 404 and "not found" in r.json()["error"]["message"]


async def test_cancel_pull(hub: FakeHub, client: httpx.AsyncClient, bus: EventBus) -> None:
    f = hub.add(f"{REPO}/slow.gguf", small_gguf(3_000_000))
    f.behavior.bytes_per_s = 300_000
    assert (await client.delete("/models/pull/pull-unknown")).status_code == 404
    r = await client.post("/models/pull", json={"model": f"{REPO}/slow.gguf"})
    pull_id = r.json()["id"]
    r = await client.delete("/models/pull/" + pull_id)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = await client.delete("/models/pull/" + pull_id)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"


async def test_delete_model_refuses_while_loaded_unless_forced(
        client: httpx.AsyncClient, store: ModelStore) -> None:
    (store.root / "here.gguf").write_bytes(b"GGUF")
    router: FakeRouter = client.router  # type: ignore[attr-defined]
    router.loaded.add("here")
    r = await client.delete("/models/here")
    assert r.status_code == 409 and "is loaded" in r.json()["error"]["message"]
    assert store.get("here") is not None
    r = await client.delete("/models/here", params={"force": "true"})
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert router.unloaded == ["here"] and router.removed == ["here"] and store.get("here") is None
    r = await client.delete("/models/here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_delete_downloading_model(hub: FakeHub, client: httpx.AsyncClient) -> None:
    f = hub.add(f"{REPO}/dl.gguf", small_gguf(3_000_000))
    f.behavior.bytes_per_s = 300_000
    await client.post("/models/pull", json={"model": f"{REPO}/dl.gguf"})
    r = await client.delete("/models/dl")
    assert r.status_code == 409 and "downloading" in r.json()["error"]["message"]
    r = await client.delete("/models/dl", params={"force": "true"})
    assert r.status_code == 200 and r.json()["cancelled"].startswith("pull-")
