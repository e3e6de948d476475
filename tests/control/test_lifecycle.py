"""Instance lifecycle with fake workers: load, unload, crash, restart, failures, events."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal

import httpx
import pytest

from corral.control.instance.instance import InstanceState, Timeouts
from corral.errors import Unavailable
from support.fake_link import FakeSpawner, fake_pool
from support.harness import Harness, _until, chat, wait_event


def transitions(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["old"], e["new"]) for e in events if e["event"] == "status_change"]


async def test_exact_state_events_for_load_crash_restart_unload(harness: Harness) -> None:
    await harness.serve()
    plane = harness.plane
    seen: list[dict] = []
    async with plane.bus.subscribe() as q:
        r = await harness.client.post("/models/load", json={"model": "a"})
        assert r.json() == {"success": True}
        ready = await wait_event(q, lambda e: e.get("new") == "ready", seen=seen)
        pid = ready["pid"]
        os.kill(pid, signal.SIGKILL)
        failed = await wait_event(q, lambda e: e.get("new") == "failed", seen=seen)
        await wait_event(q, lambda e: e.get("new") == "ready", seen=seen)
        r = await harness.client.post("/models/unload", json={"model": "a"})
        assert r.json() == {"success": True}
        await wait_event(q, lambda e: e.get("new") == "stopped", seen=seen)
    assert transitions(seen) == [
        ("stopped", "starting"), ("starting", "ready"),
        ("ready", "failed"), ("failed", "starting"), ("starting", "ready"),
        ("ready", "stopping"), ("stopping", "stopped"),
    ]
    assert all(e["model"] == "a" and e["instance"] == 0 for e in seen)
    assert failed["exit_code"] == -9 and failed["pid"] == pid
    assert "SIGKILL" in failed["reason"] and "out of memory" in failed["reason"]
    assert seen[-1]["exit_code"] == 0  # Shutdown -> the worker exits 0


async def test_events_stream_over_sse(harness: Harness) -> None:
    await harness.serve()
    lines: list[dict] = []
    async with harness.client.stream("GET", "/models/events") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        it = resp.aiter_lines()
        assert await anext(it) == ": connected"
        load = asyncio.create_task(harness.client.post("/models/load", json={"model": "a"}))
        async for line in it:
            if line.startswith("data: "):
                lines.append(json.loads(line[6:]))
                if lines[-1].get("new") == "ready":
                    break
        await load
    assert [(e["event"], e["model"], e["old"], e["new"]) for e in lines] == [
        ("status_change", "a", "stopped", "starting"), ("status_change", "a", "starting", "ready")]


async def test_crash_mid_stream_errors_clients_restarts_and_spares_other_model(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a", token_delay_s=0.02))},
                          "b": {"path": str(harness.script("b"))}})
    plane = await harness.start(cfg)
    c = harness.client
    await c.post("/models/load", json={"model": "b"})
    async with plane.bus.subscribe() as q:
        async with c.stream("POST", "/v1/chat/completions", json=chat("a", "FOREVER", stream=True)) as resp:
            it = resp.aiter_lines()
            first = [line async for line in _take_data(it, 3)]
            assert len(first) == 3
            other = asyncio.create_task(c.post("/v1/chat/completions", json=chat("a", "FOREVER")))
            await _until(lambda: plane.pools["a"].inflight == 2)
            os.kill(plane.pools["a"].instances[0].pid, signal.SIGKILL)
            rest = [line async for line in _take_data(it, 10_000)]
        err = json.loads(rest[-1])
        assert err["error"]["code"] == "worker_crashed" and "SIGKILL" in err["error"]["message"]
        r = await other
        assert r.status_code == 502 and r.json()["error"]["code"] == "worker_crashed"
        # the other model never noticed
        r = await c.post("/v1/chat/completions", json=chat("b"))
        assert r.status_code == 200
        await wait_event(q, lambda e: e.get("model") == "a" and e.get("new") == "ready")
    r = await c.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 200
    models = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert models["a"]["instances"][0]["restarts"] == 1
    assert models["b"]["instances"][0]["restarts"] == 0


async def test_load_failure_is_reported_and_final(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="corral.instance")
    cfg = harness.config({"bad": {"path": str(harness.script("bad", load_fail="unknown model architecture: 'xyz'",
                                                             stderr=["llama_model_load: error loading"]))}})
    plane = await harness.start(cfg)
    r = await harness.client.post("/v1/chat/completions", json=chat("bad"))
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "model_load_failed" and "unknown model architecture" in err["message"]
    m = (await harness.client.get("/models")).json()["data"][0]
    assert m["status"]["value"] == "failed" and m["status"]["failed"] is True
    assert "unknown model architecture" in m["status"]["reason"]
    assert "llama_model_load" not in m["status"]["reason"]  # the worker's log is the operator's...
    assert any("llama_model_load: error loading" in r.getMessage() for r in caplog.records)  # ...in the router's
    assert m["instances"][0]["exit_code"] == 1
    # a failed model stays failed for requests (no load storm)...
    r = await harness.client.post("/v1/chat/completions", json=chat("bad"))
    assert r.status_code == 503 and "POST /models/load" in r.json()["error"]["message"]
    assert plane.pools["bad"].loads == 1
    # ...until loaded explicitly
    r = await harness.client.post("/models/load", json={"model": "bad"})
    assert r.status_code == 503 and plane.pools["bad"].loads == 2


async def test_crash_while_loading_retries_then_stays_failed(harness: Harness) -> None:
    cfg = harness.config({"c": {"path": str(harness.script("c", exit_on_load=3))}}, max_restarts=2)
    plane = await harness.start(cfg)
    seen: list[dict] = []
    async with plane.bus.subscribe() as q:
        r = await harness.client.post("/models/load", json={"model": "c"})
        assert r.status_code == 503 and "exited with code 3" in r.json()["error"]["message"]
        while not q.empty():
            seen.append(q.get_nowait())
    assert transitions(seen) == [("stopped", "starting"), ("starting", "failed"),
                                 ("failed", "starting"), ("starting", "failed"),
                                 ("failed", "starting"), ("starting", "failed")]
    assert [e.get("exit_code") for e in seen if e["new"] == "failed"] == [3, 3, 3]
    assert plane.pools["c"].status() == "failed"


async def test_autoload_off(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}}, autoload=False)
    r = await harness.client.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_loaded"
    await harness.client.post("/models/load", json={"model": "a"})
    assert (await harness.client.post("/v1/chat/completions", json=chat("a"))).status_code == 200


async def test_unload_lets_running_request_finish(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a", token_delay_s=0.05))}})
    plane = await harness.start(cfg)
    running = asyncio.create_task(harness.client.post("/v1/chat/completions", json=chat("a")))
    await _until(lambda: plane.pools["a"].inflight == 1)
    r = await harness.client.post("/models/unload", json={"model": "a"})
    assert r.status_code == 200
    assert running.done()  # unload returned after the request ended
    r = running.result()
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello, world!"
    assert plane.pools["a"].status() == "unloaded"


async def test_router_shutdown_stops_workers(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "instances": 2}})
    plane = harness.plane
    await harness.client.post("/models/load", json={"model": "a"})
    pids = [i.pid for i in plane.pools["a"].instances]
    assert len(set(pids)) == 2
    await harness.stop()
    harness.server = None
    for pid in pids:
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _take_data(it, n: int):  # noqa: ANN001, ANN202
    got = 0
    async for line in it:
        if line.startswith("data: "):
            yield line[6:]
            got += 1
            if got >= n:
                return


__all__ = ["httpx"]


async def test_stop_during_start(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a", load_delay_s=0.5))}})
    plane = harness.plane
    seen: list[dict] = []
    async with plane.bus.subscribe() as q:
        load = asyncio.create_task(harness.client.post("/v1/completions", json={"model": "a", "prompt": "x"}))
        await wait_event(q, lambda e: e.get("new") == "starting", seen=seen)
        r = await harness.client.post("/models/unload", json={"model": "a"})
        assert r.status_code == 200
        await wait_event(q, lambda e: e.get("new") == "stopped", seen=seen)
    r = await load  # the request goes back to the top and loads the model again (issue 8: no 5xx)
    assert r.status_code == 200, r.text
    assert transitions(seen) == [("stopped", "starting"), ("starting", "stopping"), ("stopping", "stopped")]
    assert plane.pools["a"].status() == "loaded"


async def test_explicit_load_cancelled_by_an_unload_is_409(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a", load_delay_s=0.5))}})
    plane = harness.plane
    async with plane.bus.subscribe() as q:
        load = asyncio.create_task(harness.client.post("/models/load", json={"model": "a"}))
        await wait_event(q, lambda e: e.get("new") == "starting")
        assert (await harness.client.post("/models/unload", json={"model": "a"})).status_code == 200
    r = await load
    assert r.status_code == 409 and "unloaded" in r.json()["error"]["message"], r.text
    assert plane.pools["a"].status() == "unloaded"


async def test_second_stop_fails_the_start_that_was_to_follow() -> None:
    spawner = FakeSpawner(exit_on_shutdown=False)  # it exits when terminated, after the stop grace
    pool = fake_pool(spawner, timeouts=Timeouts(load_timeout_s=5.0, stop_grace_s=0.05))
    pool.start()
    await pool.wait_ready(5)
    inst = pool.instances[0]
    first = asyncio.create_task(inst.stop("one"))
    await _until(lambda: inst.state is InstanceState.STOPPING)
    start = inst.request_start()  # to run once stopped ...
    second = asyncio.create_task(inst.stop("two"))  # ... called off by a second stop
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    with pytest.raises(Unavailable):
        await asyncio.wait_for(start, 5)
    assert inst.state is InstanceState.STOPPED


async def test_discard_fails_what_waits_for_the_instance() -> None:
    spawner = FakeSpawner(ready=False)  # loading until the test says otherwise
    pool = fake_pool(spawner)
    pool.start()
    await spawner.next_link()
    inst = pool.instances[0]
    await _until(lambda: inst.state is InstanceState.STARTING)
    waiting = inst.request_start()
    inst.discard()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(waiting, 5)


def _restarts_metric(text: str, model: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("corral_restarts_total{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_restarts_metric_counts_performed_restarts(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a"))}, "b": {"path": str(harness.script("b"))}},
                         restart_backoff_s=0.05)
    plane = await harness.start(cfg)
    async with plane.bus.subscribe() as q:
        await harness.client.post("/models/load", json={"model": "a"})
        await harness.client.post("/models/load", json={"model": "b"})
        os.kill(plane.pools["a"].instances[0].pid, signal.SIGKILL)
        await wait_event(q, lambda e: e.get("model") == "a" and e.get("new") == "failed")
        await wait_event(q, lambda e: e.get("model") == "a" and e.get("new") == "ready")
    text = (await harness.client.get("/metrics")).text
    assert _restarts_metric(text, "a") == plane.pools["a"].instances[0].restarts == 1


async def test_restarts_metric_ignores_a_restart_that_never_happened(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a"))}}, restart_backoff_s=20)
    plane = await harness.start(cfg)
    async with plane.bus.subscribe() as q:
        await harness.client.post("/models/load", json={"model": "a"})
        os.kill(plane.pools["a"].instances[0].pid, signal.SIGKILL)
        await wait_event(q, lambda e: e.get("model") == "a" and e.get("new") == "failed")
    await harness.client.post("/models/unload", json={"model": "a"})  # the restart is called off
    text = (await harness.client.get("/metrics")).text
    assert _restarts_metric(text, "a") == plane.pools["a"].instances[0].restarts == 0


async def test_request_retries_a_crash_looping_model_after_its_backoff(harness: Harness) -> None:
    script = harness.script("c", exit_on_load=3)
    await harness.serve({"c": {"path": str(script)}}, max_restarts=0,
                        restart_backoff_s=0.2)
    plane = harness.plane
    r = await harness.client.post("/v1/chat/completions", json=chat("c"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
    script.write_text("{}")  # whatever made it crash has passed
    await _until(lambda: plane.pools["c"].retry_due)
    r = await harness.client.post("/v1/chat/completions", json=chat("c"))
    assert r.status_code == 200, r.text


async def test_a_worker_of_another_protocol_version_fails_to_load(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a", protocol=99))}})
    plane = harness.plane
    r = await harness.client.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 503 and "wire protocol 99" in r.json()["error"]["message"], r.text
    assert plane.pools["a"].status() == "failed"
