"""End to end: pull the default model's .gguf from the fake hub through the real
server (create_app), then load it in a real worker and ask it something."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from pathlib import Path

import httpx
import pytest
import uvicorn

from corral.api.app import create_app
from corral.config.file import config_from_dict
from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL

from .fake_hub import FakeHub

pytestmark = pytest.mark.integration


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    return h.hexdigest()


async def test_pull_then_load_and_query(hub: FakeHub, model_path: Path, tmp_path: Path) -> None:
    sha = _sha256(model_path)
    f = hub.add("ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf", path=model_path, sha256=sha)
    f.behavior.cut_after = 64 * 1024 * 1024  # and a dropped connection on the way
    models_dir = tmp_path / "models"
    cfg = config_from_dict(
        {"server": {"models_dir": str(models_dir), "include_default_model": False,
                    "log_dir": str(tmp_path / "logs")}, "defaults": {"ctx_len": TEST_CTX_LEN, "n_parallel": TEST_N_PARALLEL}, "models": {}},
        name="e2e.toml", base_dir=tmp_path)
    app = create_app(cfg, embedded=None, use_store=True)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not server.started:  # uvicorn offers nothing to await
        assert not task.done() and loop.time() < deadline, "server did not start"
        await asyncio.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client, \
                app.state.bus.subscribe() as q:
            r = await client.post("/models/pull", json={"model": "ggml-org/gemma-3-270m-GGUF:Q4_K_M"})
            assert r.status_code == 202, r.text
            pull_id, model_id = r.json()["id"], r.json()["model"]
            assert model_id == "ggml-org/gemma-3-270m-GGUF:Q4_K_M"  # the name it was pulled by

            async def finished() -> dict:
                while True:
                    ev = await q.get()
                    if ev.get("pull_id") == pull_id and ev["event"] in (
                            "download_finished", "download_failed", "download_cancelled"):
                        return ev

            ev = await asyncio.wait_for(finished(), 180)
            assert ev["event"] == "download_finished", ev
            assert ev["sha256"] == sha and ev["size"] == model_path.stat().st_size
            assert hub.range_starts("ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf") == [
                None, 64 * 1024 * 1024]

            listed = (await client.get("/models")).json()["data"]
            assert model_id in [m["id"] for m in listed]

            r = await client.post("/v1/completions", json={
                "model": model_id, "prompt": "The capital of France is", "max_tokens": 8,
                "temperature": 0})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["choices"][0]["text"].strip() and body["usage"]["completion_tokens"] > 0

            r = await client.delete(f"/models/{model_id}")  # it is loaded now
            assert r.status_code == 409, r.text
            r = await client.delete(f"/models/{model_id}", params={"force": "true"})
            assert r.status_code == 200, r.text
            assert not (models_dir / f"{model_id}.gguf").exists()
            listed = (await client.get("/models")).json()["data"]
            assert model_id not in [m["id"] for m in listed]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 60)
