"""`corral serve --ray`: instances on a real 2-node Ray cluster, seen and used through the
router's HTTP API; faults; no orphans after the router is SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import TAG, Events, Nodes, RayRouter, corral_workers

pytestmark = pytest.mark.integration


def model(model_path: Path, **kw: Any) -> dict[str, Any]:
    return {"path": str(model_path), "ctx_len": 512, "n_parallel": 2, "threads": 1, **kw}


def mid(name: str) -> str:
    return f"{TAG}{name}-{uuid.uuid4().hex[:6]}"


def completion(m: str, **kw: Any) -> dict[str, Any]:
    return {"model": m, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, **kw}


async def ready_instances(r: RayRouter, m: str, n: int, ev: Events, since: int = 0) -> list[dict[str, Any]]:
    while True:
        insts = (await r.model(m))["instances"]
        if sum(i["state"] == "ready" for i in insts) >= n:
            return insts
        await ev.wait(lambda e: e.get("model") == m and e.get("new") == "ready", since=len(ev.seen) - 1
                      if ev.seen else 0)


async def test_pinned_by_resources_and_shown_by_node(cluster: Nodes, tmp_path: Path, model_path: Path) -> None:
    a, b = mid("a"), mid("b")
    r = RayRouter(tmp_path, cluster, {a: model(model_path, ray_resources={"node_a": 1}),
                                      b: model(model_path, ray_resources={"node_b": 1})})
    try:
        await r.wait_up()
        health = (await r.client.get("/health")).json()
        assert health["ray"]["status"] == "connected", health
        by_res = {next(iter(n["resources"])): n["node_id"] for n in health["ray"]["nodes"] if n["alive"]}
        assert set(by_res) == {"node_a", "node_b"}
        for m in (a, b):
            resp = await r.client.post("/models/load", json={"model": m})
            assert resp.status_code == 200, resp.text
        ma, mb = await r.model(a), await r.model(b)
        assert ma["instances"][0]["node"] == {"id": by_res["node_a"], "address": "127.0.0.1"}
        assert mb["instances"][0]["node"] == {"id": by_res["node_b"], "address": "127.0.0.1"}
        outs = await asyncio.gather(*(r.client.post("/v1/completions", json=completion(m)) for m in (a, b, a, b)))
        assert [o.status_code for o in outs] == [200] * 4
        metrics = (await r.client.get("/metrics")).text
        assert f'node="{by_res["node_b"]}"' in metrics and f'model="{b}"' in metrics
    finally:
        await r.stop()
    assert not corral_workers(a) and not corral_workers(b), "the router's stop left workers behind"
    assert not _named_actors(cluster, a) and not _named_actors(cluster, b), "the router's stop left actors"


async def test_faults_fail_one_instance_and_it_comes_back(cluster: Nodes, tmp_path: Path, model_path: Path) -> None:
    m = mid("f")
    r = RayRouter(tmp_path, cluster, {m: model(model_path, instances=2, load_on_startup=True)})
    ev: Events | None = None
    try:
        await r.wait_up()
        ev = Events(r)
        insts = await ready_instances(r, m, 2, ev)
        assert len({i["node"]["id"] for i in insts}) == 2, "the 2 instances should be on 2 nodes"
        node_b = next(n["node_id"] for n in (await r.client.get("/health")).json()["ray"]["nodes"]
                      if "node_b" in n["resources"] and n["alive"])

        # 1. the worker serving a stream dies: that stream ends with an error at once
        since = len(ev.seen)
        victim, stream_err = await _stream_and_kill(r, m)
        assert stream_err is not None and "SIGKILL" in stream_err["message"], stream_err
        failed = await ev.wait(lambda e: e.get("model") == m and e.get("new") == "failed", since=since)
        assert "127.0.0.1" in failed["reason"] and victim["node"]["id"][:12] in failed["reason"], failed
        assert (await r.client.post("/v1/completions", json=completion(m))).status_code == 200
        await ev.wait(lambda e: e.get("model") == m and e.get("new") == "ready", since=since)

        # 2. its actor dies (the worker's parent)
        on_b = next(i for i in (await r.model(m))["instances"] if i["node"]["id"] == node_b)
        actor_pid = _ppid(on_b["pid"])
        since = len(ev.seen)
        os.kill(actor_pid, signal.SIGKILL)
        failed = await ev.wait(lambda e: e.get("model") == m and e.get("new") == "failed", since=since)
        assert node_b[:12] in failed["reason"], failed
        assert (await r.client.post("/v1/completions", json=completion(m))).status_code == 200
        await ev.wait(lambda e: e.get("model") == m and e.get("new") == "ready", since=since)

        # 3. node_b is lost: the model is served by node_a; the instance returns on a new node
        on_b = next(i for i in (await r.model(m))["instances"] if i["node"]["id"] == node_b)
        since = len(ev.seen)
        cluster.kill("node_b")
        failed = await ev.wait(lambda e: e.get("model") == m and e.get("new") == "failed", since=since)
        assert node_b[:12] in failed["reason"], failed
        outs = await asyncio.gather(*(r.client.post("/v1/completions", json=completion(m)) for _ in range(3)))
        assert [o.status_code for o in outs] == [200] * 3
        await asyncio.to_thread(cluster.ensure_both)  # room again (node_a's one CPU is taken)
        back = await ev.wait(lambda e: e.get("model") == m and e.get("new") == "ready"
                             and e.get("instance") == on_b["index"], since=since)
        insts = (await r.model(m))["instances"]
        assert all(i["state"] == "ready" for i in insts), insts
        assert node_b not in {i["node"]["id"] for i in insts} and len({i["node"]["id"] for i in insts}) == 2
        assert back
    finally:
        if ev is not None:
            ev.close()
        await r.stop()
    assert not corral_workers(m)


async def test_router_sigkill_leaves_no_actor_and_no_worker(cluster: Nodes, tmp_path: Path, model_path: Path) -> None:
    m = mid("k")
    r = RayRouter(tmp_path, cluster, {m: model(model_path, instances=2, load_on_startup=True)})
    try:
        await r.wait_up()
        ev = Events(r)
        await ready_instances(r, m, 2, ev)
        ev.close()
        assert len(corral_workers(m)) == 2
        assert len(_named_actors(cluster, m)) == 2
        os.kill(r.proc.pid, signal.SIGKILL)
        r.proc.wait()
        await wait_no_orphans(cluster, m)
        assert not corral_workers(m), "a worker survived its router"
        assert not _named_actors(cluster, m), "an actor survived its router"
    finally:
        await r.stop()


async def _stream_and_kill(r: RayRouter, m: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Streams a long request; once it runs, SIGKILLs the worker serving it. Returns that
    instance and the SSE error object the stream ended with."""
    body = completion(m, max_tokens=300, stream=True, ignore_eos=True)
    victim: dict[str, Any] | None = None
    async with r.client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                assert victim is not None
                return victim, obj["error"]
            if victim is None:
                victim = next(i for i in (await r.model(m))["instances"] if i["slots"]["busy"])
                os.kill(victim["pid"], signal.SIGKILL)
    raise AssertionError("the stream ended without an error")


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def wait_no_orphans(cluster: Nodes, m: str) -> None:
    """Until no worker and no actor of ``m`` is left, at most 30 s (nothing to await across
    processes: poll until Ray and the kernel have cleaned up)."""
    for _ in range(300):
        if not corral_workers(m) and not _named_actors(cluster, m):
            return
        await asyncio.sleep(0.1)


def _named_actors(cluster: Nodes, model_id: str) -> list[str]:
    code = ("import ray, json\n"
            f"ray.init(address={cluster.address!r}, logging_level='ERROR', log_to_driver=False)\n"
            "print(json.dumps(ray.util.list_named_actors(all_namespaces=True)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    names = json.loads(out.strip().splitlines()[-1])
    return [n["name"] for n in names if model_id in n["name"]]


async def test_per_node_budget_evicts_idle_models_never_busy_ones(cluster: Nodes, tmp_path: Path,
                                                                  model_path: Path) -> None:
    """Two models that each need node_a's one CPU: loading the second evicts the first
    when it is idle, and never while it serves (the load then gets 503 after the wait)."""
    p, q = mid("p"), mid("q")
    pinned = {"ray_resources": {"node_a": 1}, "ctx_len": 4096, "n_parallel": 1, "own_instances": True}
    r = RayRouter(tmp_path, cluster, {p: model(model_path, **pinned), q: model(model_path, **pinned)},
                  queue_timeout_s=3.0)
    try:
        await r.wait_up()
        assert (await r.client.post("/models/load", json={"model": p})).status_code == 200
        body = completion(p, max_tokens=3000, stream=True, ignore_eos=True)
        first = asyncio.get_running_loop().create_future()

        async def stream() -> None:  # reads on until cancelled: closing the stream aborts it
            async with r.client.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and not first.done():
                        first.set_result(line)

        reader = asyncio.ensure_future(stream())
        assert "error" not in json.loads((await asyncio.wait_for(first, 60))[6:])  # p is busy now
        busy = await r.client.post("/models/load", json={"model": q})
        assert busy.status_code == 503, busy.text
        assert "no node of the Ray cluster has room" in busy.json()["error"]["message"]
        assert (await r.model(p))["status"]["value"] == "loaded" and not reader.done()
        reader.cancel()
        # the stream is closed (the request aborted): p is idle and gets evicted for q
        ok = await r.client.post("/models/load", json={"model": q})
        assert ok.status_code == 200, ok.text
        assert (await r.model(p))["status"]["value"] == "unloaded"
        assert (await r.client.post("/v1/completions", json=completion(q))).status_code == 200
    finally:
        await r.stop()
    assert not corral_workers(p) and not corral_workers(q)
