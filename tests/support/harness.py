"""Router test harness: a real uvicorn server in the test's event loop, fake worker processes.

``harness.script(name, **kw)`` writes a fake-worker script (see fake_worker.py) and
returns its path, which serves as the model's ``path``. ``harness.serve(models, keys=...,
**server)`` starts the router (one fake model "a" when no models are given);
``harness.start(cfg)`` starts it with a config made otherwise (a file's, with a loader, a store).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from corral.api.app import create_app
from corral.config.file import CorralConfig, config_from_dict
from corral.events import Event
from corral.control.plane import ControlPlane
from support.keys import write_keys_file
from support.waiting import until_async
from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL

FAKE = Path(__file__).parent / "fake_worker.py"


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self.base_url = ""
        self.app: Any = None

    def script(self, name: str, **kw: Any) -> Path:
        p = self.tmp / f"{name}.json"
        p.write_text(json.dumps(kw))
        return p

    def requests_seen(self, name: str) -> list[dict[str, Any]]:
        p = self.tmp / f"{name}.json.log"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines()]

    def config(self, models: dict[str, dict[str, Any]], **server: Any) -> CorralConfig:
        """The router config of ``models`` (each inherits ``[defaults] ctx_len = TEST_CTX_LEN``
        unless its table sets one)."""
        srv = self.server_table(**server)
        return config_from_dict({"server": srv, "defaults": {"ctx_len": TEST_CTX_LEN, "n_parallel": TEST_N_PARALLEL}, "models": models},
                                name="test.toml", base_dir=self.tmp)

    def server_table(self, **server: Any) -> dict[str, Any]:
        srv = {"worker_command": [sys.executable, str(FAKE)], "include_default_model": False,
               "log_dir": str(self.tmp / "logs"), "restart_backoff_s": 0.05, "stop_grace_s": 2.0,
               "queue_timeout_s": 10.0, "load_timeout_s": 20.0,
               # the router runs on the test's own loop, whose sync steps would count as its lag:
               # no shedding unless a test asks for it (tests/api/test_overload.py)
               "shed_lag_s": 0}
        srv.update(server)
        return srv

    async def start(self, cfg: CorralConfig, *, loader: Callable[[], CorralConfig] | None = None,
                    sighup: bool = False, embedded: Any = None, use_store: bool = False) -> ControlPlane:
        self.app = create_app(cfg, config_loader=loader, embedded=embedded, use_store=use_store,
                              handle_sighup=sighup)
        sock = socket.socket()
        # accepted sockets inherit this; without it Nagle + delayed ACK add 40 ms per response
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not self.server.started:  # uvicorn offers nothing to await
            assert not self.task.done(), "server failed to start"
            assert loop.time() < deadline, "server did not start"
            await asyncio.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{port}"
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=30)
        return self.plane

    async def serve(self, models: dict[str, dict[str, Any]] | None = None, *,
                    keys: dict[str, dict[str, Any]] | None = None, sighup: bool = False,
                    **server: Any) -> dict[str, str]:
        """Start serving ``models`` (None: one fake model, "a") under ``server``'s settings, with
        a keys file (``tmp/keys.toml``) of ``keys`` (name -> its KeySpec fields) where given;
        each key's secret by name. ``sighup``: SIGHUP reloads, as in ``corral serve``."""
        secrets: dict[str, str] = {}
        if keys is not None:
            path = self.tmp / "keys.toml"
            secrets = write_keys_file(path, **keys)
            server = {"keys_file": str(path), **server}
        if models is None:
            models = {"a": {"path": str(self.script("a"))}}
        await self.start(self.config(models, **server), sighup=sighup)
        return secrets

    @property
    def client(self) -> httpx.AsyncClient:
        """The client of the started server (``start`` first)."""
        assert self._client is not None, "Harness.start() first"
        return self._client

    @property
    def plane(self) -> ControlPlane:
        return self.app.state.router

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            await asyncio.wait_for(self.task, 30)
        self.server = self.task = self._client = None  # start() may run again


async def wait_event(q: "asyncio.Queue[Event]", pred: Callable[[Event], bool],
                     timeout: float = 15.0, seen: list[Event] | None = None) -> Event:
    """The next event on ``q`` that matches; all events read go to ``seen``."""
    async with asyncio.timeout(timeout):
        while True:
            ev = await q.get()
            if seen is not None:
                seen.append(ev)
            if pred(ev):
                return ev


def chat(model: str, content: str = "hi", **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **kw}


async def _until(pred, timeout: float = 10.0) -> None:  # noqa: ANN001
    """For router-internal state with no event to await: poll with a deadline."""
    await until_async(pred, timeout, "a router-internal condition")
