"""Defects found in a read of the control plane, each pinned by a test."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from corral.config import load_config
from corral.control.instance.instance import InstanceState
from corral.errors import Unavailable
from support.harness import Harness, chat, wait_event
from support.harness import _until
from control.test_reload import write_config


async def test_second_stop_fails_the_start_that_was_to_follow(harness: Harness) -> None:
    plane = await harness.start(harness.config({"a": {"path": str(harness.script("a", shutdown_delay_s=1.0))}}))
    await harness.client.post("/models/load", json={"model": "a"})
    inst = plane.pools["a"].instances[0]
    first = asyncio.create_task(inst.stop("one"))
    await _until(lambda: inst.state is InstanceState.STOPPING)
    start = inst.request_start()  # to run once stopped ...
    second = asyncio.create_task(inst.stop("two"))  # ... called off by a second stop
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    with pytest.raises(Unavailable):
        await asyncio.wait_for(start, 5)
    assert inst.state is InstanceState.STOPPED


async def test_discard_fails_what_waits_for_the_instance(harness: Harness) -> None:
    plane = await harness.start(harness.config({"a": {"path": str(harness.script("a", load_delay_s=5.0))}}))
    load = asyncio.create_task(harness.client.post("/models/load", json={"model": "a"}))
    await _until(lambda: bool(plane.pools["a"].instances)
                 and plane.pools["a"].instances[0].state is InstanceState.STARTING)
    inst = plane.pools["a"].instances[0]
    waiting = inst.request_start()
    inst.discard()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(waiting, 5)
    load.cancel()


async def test_reload_restart_stays_within_max_loaded_models(harness: Harness) -> None:
    cfg_path = harness.tmp / "corral.toml"
    srv = harness.server_table(max_loaded_models=1)
    a, b = str(harness.script("a", slow_delay_s=0.2)), str(harness.script("b"))
    write_config(cfg_path, srv, {"a": {"path": a}, "b": {"path": b}})
    plane = await harness.start(load_config(cfg_path), loader=lambda: load_config(cfg_path))
    c = harness.client
    await c.post("/models/load", json={"model": "a"})
    running = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "SLOW"}))
    await _until(lambda: plane.pools["a"].inflight == 1)
    write_config(cfg_path, srv, {"a": {"path": a, "n_parallel": 2}, "b": {"path": b}})
    reload = asyncio.create_task(c.post("/models/reload"))
    await _until(lambda: plane.pools["a"].draining)
    other = asyncio.create_task(c.post("/v1/chat/completions", json=chat("b")))  # b loads meanwhile
    r = await reload
    assert r.status_code == 200 and r.json()["restarted"] == ["a"], r.text
    assert (await running).status_code == 200 and (await other).status_code == 200
    assert sum(p.occupies for p in plane.pools.values()) <= 1


async def test_reload_reports_and_logs_a_failed_restart(harness: Harness,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cfg_path = harness.tmp / "corral.toml"
    srv = harness.server_table()
    write_config(cfg_path, srv, {"a": {"path": str(harness.script("a"))}})
    plane = await harness.start(load_config(cfg_path), loader=lambda: load_config(cfg_path))
    await harness.client.post("/models/load", json={"model": "a"})
    write_config(cfg_path, srv, {"a": {"path": str(harness.script("a2", load_fail="broken now"))}})
    with caplog.at_level(logging.WARNING):
        r = await harness.client.post("/models/reload")
    assert r.status_code == 200 and r.json()["failed"] == ["a"], r.text
    assert any("reload" in rec.getMessage() and "broken now" in rec.getMessage() for rec in caplog.records)
    assert plane.pools["a"].status() == "failed"


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


async def test_sighup_reload_task_is_kept(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    plane = await harness.start(harness.config({"a": {"path": str(harness.script("a"))}}), sighup=True)
    release: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def reload() -> dict[str, list[str]]:
        await release
        return {}

    monkeypatch.setattr(plane, "reload", reload)
    os.kill(os.getpid(), signal.SIGHUP)
    await _until(lambda: any(t.get_name() == "reload (SIGHUP)" for t in plane.background_tasks))
    release.set_result(None)
    await _until(lambda: not any(t.get_name() == "reload (SIGHUP)" for t in plane.background_tasks))


async def test_request_retries_a_crash_looping_model_after_its_backoff(harness: Harness) -> None:
    script = harness.script("c", exit_on_load=3)
    plane = await harness.start(harness.config({"c": {"path": str(script)}}, max_restarts=0,
                                               restart_backoff_s=0.2))
    r = await harness.client.post("/v1/chat/completions", json=chat("c"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
    script.write_text("{}")  # whatever made it crash has passed
    await _until(lambda: plane.pools["c"].retry_due)
    r = await harness.client.post("/v1/chat/completions", json=chat("c"))
    assert r.status_code == 200, r.text


async def test_a_worker_of_another_protocol_version_fails_to_load(harness: Harness) -> None:
    plane = await harness.start(harness.config({"a": {"path": str(harness.script("a", protocol=99))}}))
    r = await harness.client.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 503 and "wire protocol 99" in r.json()["error"]["message"], r.text
    assert plane.pools["a"].status() == "failed"
