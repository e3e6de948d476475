"""Supervision with real workers and the real model: crash, restart, disconnect, router death."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from testkit.gguf_hostile import small_gguf
from support.harness import Harness, chat, wait_event
from support.harness import _until

pytestmark = pytest.mark.integration

LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}


def models(model_path: Path, *ids: str, **kw) -> dict:  # noqa: ANN003
    """One file, ids that are models of their own (not variants): each its own worker."""
    return {i: {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1, "own_instances": True, **kw}
            for i in ids}


async def test_kill_worker_mid_stream(harness: Harness, model_path: Path) -> None:
    cfg = harness.config(models(model_path, "m1", "m2"), worker_command=None, restart_backoff_s=0.1)
    plane = await harness.start(cfg)
    c = harness.client
    seen: list[dict] = []
    async with plane.bus.subscribe() as q:
        assert (await c.post("/models/load", json={"model": "m1"})).status_code == 200
        assert (await c.post("/models/load", json={"model": "m2"})).status_code == 200
        pid = plane.pools["m1"].instances[0].pid
        data = []
        async with c.stream("POST", "/v1/chat/completions", json=chat("m1", "Tell a story.", stream=True, **LONG)) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    data.append(line[6:])
                    if len(data) == 4:
                        os.kill(pid, signal.SIGKILL)
        assert data[-1] != "[DONE]"
        err = json.loads(data[-1])["error"]
        assert err["code"] == "worker_crashed" and "SIGKILL" in err["message"]
        # the other model is unaffected while m1 restarts
        r = await c.post("/v1/completions", json={"model": "m2", "prompt": "Hello", "max_tokens": 4})
        assert r.status_code == 200
        await wait_event(q, lambda e: e.get("model") == "m1" and e.get("new") == "ready"
                         and e.get("pid") != pid, seen=seen)
    m1 = [(e["old"], e["new"]) for e in seen if e.get("model") == "m1"]
    assert m1 == [("stopped", "starting"), ("starting", "ready"), ("ready", "failed"),
                  ("failed", "starting"), ("starting", "ready")]
    assert [e.get("exit_code") for e in seen if e.get("new") == "failed"] == [-9]
    r = await c.post("/v1/completions", json={"model": "m1", "prompt": "Hello", "max_tokens": 4})
    assert r.status_code == 200
    assert all(e.get("model") != "m2" or e["new"] in ("starting", "ready") for e in seen)


async def test_client_disconnect_frees_the_slot(harness: Harness, model_path: Path) -> None:
    cfg = harness.config(models(model_path, "m", n_parallel=1), worker_command=None)
    plane = await harness.start(cfg)
    c = harness.client
    async with c.stream("POST", "/v1/completions",
                        json={"model": "m", "prompt": "Once upon a time", "stream": True, **LONG}) as resp:
        n = 0
        async for line in resp.aiter_lines():
            n += line.startswith("data: ")
            if n == 3:
                break
    t0 = time.monotonic()
    await _until(lambda: plane.pools["m"].inflight == 0)
    assert time.monotonic() - t0 < 2.0  # freed by the abort, not by finishing 400 tokens
    r = await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


async def test_single_gpu_mode_switches_real_models(harness: Harness, model_path: Path) -> None:
    cfg = harness.config(models(model_path, "m1", "m2"), worker_command=None, max_loaded_models=1)
    plane = await harness.start(cfg)
    for m in ("m1", "m2", "m1"):
        r = await harness.client.post("/v1/completions", json={"model": m, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 200
        assert [p for p, pool in plane.pools.items() if pool.occupies] == [m]
    info = plane.pools["m1"].instances[0].info
    assert info is not None and info.model_bytes > 100_000_000  # the worker's own report


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    """True when ``pid`` exits within ``timeout`` (pidfd: an event, not a poll)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)


def test_router_sigkill_leaves_no_worker(tmp_path: Path, model_path: Path) -> None:
    cfg = tmp_path / "corral.toml"
    cfg.write_text(f'[server]\ninclude_default_model = false\n[models.m]\npath = "{model_path}"\n'
                   "ctx_len = 512\nn_parallel = 1\nthreads = 1\ninstances = 2\n")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    router = subprocess.Popen([sys.executable, "-m", "corral.cli.main", "serve", "--config", str(cfg),
                               "--port", str(port), "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # nothing to await across processes: poll /health with a deadline
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert router.poll() is None, "router exited"
            assert time.monotonic() < deadline, "router did not come up"
            time.sleep(0.1)
        assert httpx.post(base + "/models/load", json={"model": "m"}, timeout=60).status_code == 200
        deadline = time.monotonic() + 30
        while True:
            insts = httpx.get(base + "/models", timeout=5).json()["data"][0]["instances"]
            if all(i["state"] == "ready" for i in insts):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        pids = [i["pid"] for i in insts]
        assert len(pids) == 2 and all(pids)
        router.send_signal(signal.SIGKILL)
        router.wait(10)
        for pid in pids:
            assert _wait_pid_gone(pid, 10), f"worker {pid} outlived the router"
    finally:
        if router.poll() is None:
            router.kill()
            router.wait()


__all__ = ["asyncio"]


async def test_real_load_failure_is_reported(harness: Harness, model_path: Path) -> None:
    bad = harness.tmp / "broken.gguf"
    # a GGUF header the router reads (corral.model.gguf_header), of no model llama.cpp knows how
    # to build (no context length, no vocabulary): only llama.cpp finds out
    bad.write_bytes(small_gguf())
    cfg = harness.config({"broken": {"path": str(bad), "threads": 1, "ctx_len": 512}}, worker_command=None)
    plane = await harness.start(cfg)
    r = await harness.client.post("/v1/completions", json={"model": "broken", "prompt": "x"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
    m = (await harness.client.get("/models")).json()["data"][0]
    assert m["status"]["value"] == "failed" and m["status"]["reason"]
    assert m["instances"][0]["exit_code"] not in (None, 0)
    assert plane.pools["broken"].failed_final
