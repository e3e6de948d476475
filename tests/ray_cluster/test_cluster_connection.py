"""The router's connection to the Ray cluster: through the Ray Client (``ray://``), and
a head node that goes away and comes back on the same address."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from .conftest import Events, Nodes, RayRouter, corral_workers
from .test_cluster_router import _named_actors, completion, mid, model, ready_instances, wait_no_orphans

pytestmark = pytest.mark.integration


async def test_ray_client_address_places_serves_and_cleans_up(cluster: Nodes, tmp_path: Path,
                                                              model_path: Path) -> None:
    pytest.importorskip("grpc", reason="ray:// needs the Ray client: pip install 'ray[client]'")
    m = mid("c")
    r = RayRouter(tmp_path, cluster, {m: model(model_path)}, ray_address=cluster.client_address)
    try:
        await r.wait_up()
        health = (await r.client.get("/health")).json()["ray"]
        assert health["status"] == "connected" and health["address"] == cluster.client_address, health
        live = {n["node_id"] for n in health["nodes"] if n["alive"]}
        assert len(live) == 2, health
        assert (await r.client.post("/models/load", json={"model": m})).status_code == 200
        node = (await r.model(m))["instances"][0]["node"]
        assert node["id"] in live and node["address"] == "127.0.0.1", node
        text = await _streamed_text(r, m)
        assert text, "the streamed completion produced no text"
        assert len(corral_workers(m)) == 1 and len(_named_actors(cluster, m)) == 1
    finally:
        await r.stop()
    await wait_no_orphans(cluster, m)  # the bridge killed its actors and disconnected its client session
    assert not corral_workers(m), "a worker survived the router's stop (ray://)"
    assert not _named_actors(cluster, m), "an actor survived the router's stop (ray://)"


async def test_head_restart_is_a_clear_503_then_serves_again(cluster: Nodes, tmp_path: Path,
                                                             model_path: Path) -> None:
    m = mid("h")
    r = RayRouter(tmp_path, cluster, {m: model(model_path, instances=2, load_on_startup=True)})
    ev: Events | None = None
    try:
        await r.wait_up()
        ev = Events(r)
        await ready_instances(r, m, 2, ev)

        since = len(ev.seen)
        cluster.kill("node_a")  # the head: GCS, raylet, client server (node_b follows it)
        await ev.wait(lambda e: e.get("event") == "ray_status" and e.get("status") == "disconnected",
                      since=since)
        health = (await r.client.get("/health")).json()["ray"]
        assert health["status"] == "disconnected" and "Ray cluster" in health["reason"], health

        # requests get a 503 in OpenAI's error shape at once (no wait for the instances)
        for stream in (False, True):
            resp = await asyncio.wait_for(
                r.client.post("/v1/completions", json=completion(m, stream=stream)), 20)
            assert resp.status_code == 503, resp.text
            err = resp.json()["error"]
            assert err["code"] == "cluster_unreachable" and cluster.address in err["message"], err
            assert "Retry-After" in resp.headers

        # the router keeps trying (nothing to await from outside but /health)
        for _ in range(600):
            health = (await r.client.get("/health")).json()["ray"]
            if health["reconnect_attempts"] >= 1:
                break
            await asyncio.sleep(0.1)
        assert health["reconnect_attempts"] >= 1 and health["status"] == "disconnected", health
        assert "cannot reach the Ray head" in (health["last_attempt_error"] or ""), health

        # a new head on the same address: the router reconnects and places the instances again
        since = len(ev.seen)
        await asyncio.to_thread(cluster.ensure_both)
        await ev.wait(lambda e: e.get("event") == "ray_status" and e.get("status") == "connected",
                      since=since, timeout_s=90)
        insts = await ready_instances(r, m, 2, ev, since=since)
        assert len({i["node"]["id"] for i in insts}) == 2, insts
        health = (await r.client.get("/health")).json()["ray"]
        assert health["status"] == "connected" and health["reconnect_attempts"] == 0, health
        assert health["reason"] is None
        assert (await r.client.post("/v1/completions", json=completion(m))).status_code == 200
    finally:
        if ev is not None:
            ev.close()
        await r.stop()
    assert not corral_workers(m)


async def _streamed_text(r: RayRouter, m: str) -> str:
    body: dict[str, Any] = completion(m, max_tokens=8, stream=True)
    text = ""
    async with r.client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                obj = json.loads(line[6:])
                assert "error" not in obj, obj
                text += obj["choices"][0]["text"]
    return text
