"""Reload without restart: changed models restart, removed ones unload, running requests finish."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.config.file import load_config
from support.harness import Harness, chat, wait_event
from support.harness import _until
from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL


def write_config(path: Path, server: dict[str, Any], models: dict[str, dict[str, Any]]) -> None:
    lines = ["[server]"] + [f"{k} = {json.dumps(v)}" for k, v in server.items()]
    lines += ["[defaults]", f"ctx_len = {TEST_CTX_LEN}", f"n_parallel = {TEST_N_PARALLEL}"]
    for mid, m in models.items():
        lines.append(f'[models."{mid}"]')
        lines += [f"{k} = {json.dumps(v)}" for k, v in m.items()]
    path.write_text("\n".join(lines) + "\n")


async def test_reload_restarts_changed_unloads_removed_adds_new(harness: Harness) -> None:
    cfg_path = harness.tmp / "corral.toml"
    srv = harness.server_table()
    a, b, c = (str(harness.script(n, slow_delay_s=0.05)) for n in ("a", "b", "c"))
    write_config(cfg_path, srv, {"a": {"path": a, "n_parallel": 2}, "b": {"path": b}})
    plane = await harness.start(load_config(cfg_path), loader=lambda: load_config(cfg_path))
    cl = harness.client
    await cl.post("/models/load", json={"model": "b"})
    running = asyncio.create_task(cl.post("/v1/completions", json={"model": "a", "prompt": "SLOW"}))
    await _until(lambda: plane.pools["a"].inflight == 1)
    old_pid = plane.pools["a"].instances[0].pid

    write_config(cfg_path, srv, {"a": {"path": a, "n_parallel": 3, "aliases": ["alpha"]}, "c": {"path": c}})
    r = await cl.post("/models/reload")
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True, "added": ["c"], "removed": ["b"], "restarted": ["a"], "updated": []}
    assert running.done() and (await running).status_code == 200  # it finished on the old worker
    pool = plane.pools["a"]
    assert pool.has_ready and pool.instances[0].pid != old_pid and pool.instances[0].slots_total == 3
    assert "b" not in plane.pools
    r = await cl.post("/v1/completions", json={"model": "b", "prompt": "x"})
    assert r.status_code == 404
    assert (await cl.post("/v1/completions", json={"model": "alpha", "prompt": "x"})).status_code == 200
    assert (await cl.post("/v1/completions", json={"model": "c", "prompt": "x"})).status_code == 200


async def test_bad_config_on_reload_changes_nothing(harness: Harness) -> None:
    cfg_path = harness.tmp / "corral.toml"
    write_config(cfg_path, harness.server_table(), {"a": {"path": str(harness.script("a"))}})
    plane = await harness.start(load_config(cfg_path), loader=lambda: load_config(cfg_path))
    await harness.client.post("/models/load", json={"model": "a"})
    cfg_path.write_text(cfg_path.read_text() + "\nmax_tokns = 3\n")
    r = await harness.client.post("/models/reload")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_config" and "max_tokns" in err["message"] and str(cfg_path) in err["message"]
    assert plane.pools["a"].has_ready


async def test_sighup_reloads(harness: Harness) -> None:
    cfg_path = harness.tmp / "corral.toml"
    srv = harness.server_table()
    write_config(cfg_path, srv, {"a": {"path": str(harness.script("a"))}})
    plane = await harness.start(load_config(cfg_path), loader=lambda: load_config(cfg_path), sighup=True)
    write_config(cfg_path, srv, {"a": {"path": str(harness.script("a"))}, "new": {"path": str(harness.script("n"))}})
    async with plane.bus.subscribe() as q:
        os.kill(os.getpid(), signal.SIGHUP)
        ev = await wait_event(q, lambda e: e["event"] == "config_reloaded")
    assert ev["added"] == ["new"]
    r = await harness.client.post("/v1/chat/completions", json=chat("new"))
    assert r.status_code == 200


async def test_reload_gives_a_failed_model_a_fresh_chance(harness: Harness) -> None:
    cfg_path = harness.tmp / "corral.toml"
    script = harness.script("bad", load_fail="corrupt file")
    write_config(cfg_path, harness.server_table(), {"bad": {"path": str(script)}})
    plane = await harness.start(load_config(cfg_path), loader=lambda: load_config(cfg_path))
    assert (await harness.client.post("/v1/completions", json={"model": "bad", "prompt": "x"})).status_code == 503
    assert plane.pools["bad"].status() == "failed"
    script.write_text("{}")  # the file was fixed
    assert (await harness.client.post("/models/reload")).status_code == 200
    assert plane.pools["bad"].status() == "unloaded"
    assert (await harness.client.post("/v1/completions", json={"model": "bad", "prompt": "x"})).status_code == 200


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
