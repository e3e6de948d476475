"""The router's connection to a Ray cluster: ``RayCluster``, the ``Spawner`` of Ray instances.

One bridge child process (``python -m corral.control.transport.ray.bridge``, the Ray driver) spoken to
with ``corral.control.transport.ray.messages``; it is restarted with backoff (1 s doubling to 30 s)
when it ends, and ``status``/``reason`` say where the connection stands. ``spawn``
asks the bridge for a ``WorkerHost`` actor with the instance's resources and returns a
``RayLink`` (``corral.control.transport.ray.link``) connected to the worker. Imported only when
``[server] ray_address`` is set; it imports no Ray itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from corral import wire
from corral.config.file import ServerConfig
from corral.control.transport.ray import messages as m
from corral.errors import ClusterUnreachable, ConfigError
from corral.events import EventBus, EventName
from corral.children.exits import describe_exit
from corral.children.frames import FrameDecoder, FrameTooLarge
from corral.control.transport.link import LinkOwner
from corral.control.transport.ray.link import RayLink, RayUnavailable, file_estimate
from corral.control.transport.ray.room import NodeRoom

__all__ = ["RayCluster"]

log = logging.getLogger("corral.ray")

_CONNECT_TIMEOUT_S = 60.0
_MAX_BACKOFF_S = 30.0
_SPAWN_WAITS_FOR_CONNECTION_S = 30.0
_GCS_RECONNECT_S = "20"  # the bridge gives up on an unreachable head after this (Ray: 60 s)
# ray://: how long the client server keeps a vanished bridge's actors for it (Ray: 30 s)
_CLIENT_GRACE_S = "5"


class RayCluster:
    """The router's connection to a Ray cluster (the ``Spawner`` of Ray instances)."""

    def __init__(self, address: str, namespace: str, *, bus: EventBus | None = None,
                 log_dir: Path, worker_command: list[str] | None = None,
                 place_timeout_s: float = 300.0,
                 estimate: Callable[[wire.WorkerSettings], int] = file_estimate,
                 bridge_command: list[str] | None = None) -> None:
        self.address = address
        self.namespace = namespace
        self.status = "connecting"
        self.reason: str | None = None
        self.nodes: list[m.NodeView] = []
        self.ray_version: str | None = None
        self._bus = bus
        self._log_dir = log_dir
        self._worker_command = worker_command
        self._place_timeout_s = place_timeout_s
        self._bridge_command = bridge_command or [sys.executable, "-m", "corral.control.transport.ray.bridge"]
        self._router_id = f"{socket.gethostname()}-{os.getpid()}"
        self._seq = itertools.count(1)
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[str, asyncio.Future[m.Placed]] = {}
        self._links: dict[str, RayLink] = {}
        self.room = NodeRoom(estimate)  # the per-node budget (room.py)
        self._connected: asyncio.Event = asyncio.Event()
        self._lost_event: asyncio.Event = asyncio.Event()  # set while "disconnected"
        self.attempts = 0  # failed reconnect attempts since the connection was lost
        self.last_error: str | None = None  # why the last reconnect attempt failed
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        self._failures = 0

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def from_config(cls, srv: ServerConfig, bus: EventBus, log_dir: Path) -> RayCluster:
        """The cluster ``[server] ray_address`` names (ConfigError when Ray is not installed)."""
        assert srv.ray_address is not None
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(f"[server] ray_address = {srv.ray_address!r} needs Ray, which is not installed: "
                              "pip install 'corral[ray]'")
        return cls(srv.ray_address, srv.ray_namespace, bus=bus, log_dir=log_dir,
                   worker_command=srv.worker_command, place_timeout_s=srv.load_timeout_s)

    async def start(self, wait_s: float = _CONNECT_TIMEOUT_S) -> None:
        """Start connecting (and keep reconnecting); wait up to ``wait_s`` for the first
        connection. Not connected by then: the router runs, ``status`` says why."""
        self._runner = asyncio.get_running_loop().create_task(self._run(), name="ray bridge")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connected.wait(), wait_s)

    async def close(self) -> None:
        self._closing = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        await self._stop_bridge()

    def view(self) -> dict[str, Any]:
        return {"address": self.address, "namespace": self.namespace, "status": self.status,
                "reason": self.reason, "reconnect_attempts": self.attempts,
                "last_attempt_error": self.last_error, "ray_version": self.ray_version,
                "nodes": [msgspec.structs.asdict(n) for n in self.nodes]}

    def unreachable(self) -> ClusterUnreachable | None:
        """While disconnected: the 503 that a request for a Ray instance gets at once."""
        if self.status != "disconnected":
            return None
        return ClusterUnreachable(
            f"the Ray cluster at {self.address} is unreachable ({self.reason}); reconnecting "
            f"({self.attempts} attempt(s) so far); try again later", retry_after_s=5)

    async def while_reachable(self, waiting: Awaitable[None]) -> None:
        """Await ``waiting`` (a request waiting for an instance to start); raise
        ``unreachable()`` instead as soon as the cluster is (or becomes) disconnected."""
        err = self.unreachable()
        if err is not None:
            if asyncio.iscoroutine(waiting):
                waiting.close()
            raise err
        task = asyncio.ensure_future(waiting)
        lost = asyncio.ensure_future(self._lost_event.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            task.result()  # its own error, if any
            return
        raise self.unreachable() or ClusterUnreachable(f"lost the Ray cluster at {self.address}")

    def node_address(self, node_id: str | None) -> str | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n.address
        return None

    # ------------------------------------------------------------ Spawner

    async def spawn(self, settings: wire.WorkerSettings, owner: LinkOwner) -> RayLink:
        if self.status != "connected":  # reconnecting: wait a while (a restart after a lost head)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._connected.wait(), _SPAWN_WAITS_FOR_CONNECTION_S)
        if self.status != "connected":
            raise RayUnavailable(f"not connected to the Ray cluster at {self.address}"
                                 + (f": {self.reason}" if self.reason else ""))
        key = f"{self._router_id}/{settings.model_id}#{settings.instance}.{next(self._seq)}"
        res = self.room.claim(key, settings, self.nodes)
        fut: asyncio.Future[m.Placed] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        self._send(m.Spawn(key=key, settings_json=msgspec.json.encode(settings).decode(),
                           worker_command=self._worker_command, resources=res,
                           place_timeout_s=self._place_timeout_s))
        try:
            placed = await fut
        except BaseException:
            self.room.forget(key)
            raise
        finally:
            self._pending.pop(key, None)
        link = RayLink(owner, self, key, placed)
        self._links[key] = link
        self.room.placed(key, placed.node_id, res)
        self._publish(EventName.RAY_PLACED, settings.model_id, instance=settings.instance,
                      node_id=placed.node_id, node_address=placed.node_address,
                      hostname=placed.hostname)
        await link.connect()
        return link

    def kill(self, key: str) -> None:
        with contextlib.suppress(RayUnavailable):
            self._send(m.Kill(key))

    def forget(self, key: str) -> None:
        self._links.pop(key, None)
        self.room.forget(key)

    def room_for(self, settings: wire.WorkerSettings, count: int) -> str | None:
        """None when ``count`` more instances with these settings fit on the live nodes
        (``NodeRoom.room_for``); else why not. Nothing known yet (not connected): None."""
        if self.status != "connected" or not self.nodes:
            return None  # nothing known: let the spawn wait for the connection
        return self.room.room_for(settings, count, self.nodes)

    def learned(self, key: str, memory: int) -> None:
        """A worker reported its weights + KV: the next spawn of that shape asks for it."""
        self.room.learned(key, memory)

    # ------------------------------------------------------------ the bridge

    def _send(self, msg: m.ToBridge) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            raise RayUnavailable(f"not connected to the Ray cluster at {self.address}")
        proc.stdin.write(m.encode(msg))

    async def _run(self) -> None:
        while not self._closing:
            started = time.monotonic()
            reason = await self._bridge_session()
            if self._closing:
                return
            if self.status == "disconnected":  # a reconnect attempt failed
                self.attempts += 1
                self.last_error = reason
                self._lost(self.reason or reason)
            else:  # the connection (or the first attempt) was lost
                self._lost(reason)
            if time.monotonic() - started > _MAX_BACKOFF_S:
                self._failures = 0
            self._failures += 1
            await asyncio.sleep(min(_MAX_BACKOFF_S, 2 ** (self._failures - 1)))

    async def _bridge_session(self) -> str:
        """Run one bridge until it exits; return why it ended, in words."""
        if self.status != "disconnected":  # a lost connection stays "disconnected" until it is back
            self._set_status("connecting", None)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / "ray-bridge.log"
        with open(log_path, "ab") as log_file:
            self._proc = await asyncio.create_subprocess_exec(
                *self._bridge_command, "--address", self.address, "--namespace", self.namespace,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log_file,
                env={"RAY_gcs_rpc_server_reconnect_timeout_s": _GCS_RECONNECT_S,
                     "RAY_CLIENT_RECONNECT_GRACE_PERIOD": _CLIENT_GRACE_S, **os.environ,
                     "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
        assert self._proc.stdout is not None
        dec = FrameDecoder(m.MAX_FRAME)
        try:
            while True:
                data = await self._proc.stdout.read(1 << 16)
                if not data:
                    break
                for body in dec.feed(data):
                    self._on_message(m.decode_from_bridge(body))
        except (msgspec.DecodeError, FrameTooLarge) as exc:
            log.error("bad message from the Ray bridge: %s", exc)
        rc = await self._stop_bridge()
        tail = _last_line(log_path)
        if self.status == "connected":
            return f"lost the connection to the Ray cluster ({tail or 'the Ray bridge ' + describe_exit(rc)})"
        return tail or f"the Ray bridge {describe_exit(rc)}"

    async def _stop_bridge(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.stdin is not None:
            proc.stdin.close()  # the bridge kills its actors and exits
        try:
            return await asyncio.wait_for(proc.wait(), 10.0)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return await proc.wait()

    def _on_message(self, msg: m.FromBridge) -> None:
        if isinstance(msg, m.Connected):
            self.nodes = list(msg.nodes)
            self.ray_version = msg.ray_version
            self._failures = 0
            self.attempts = 0
            self.last_error = None
            self._set_status("connected", None)
            self._lost_event.clear()
            self._connected.set()
        elif isinstance(msg, m.Nodes):
            self.nodes = list(msg.nodes)
        elif isinstance(msg, m.Placed):
            fut = self._pending.get(msg.key)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            else:
                self.kill(msg.key)  # nobody waits for it any more
        elif isinstance(msg, m.SpawnFailed):
            fut = self._pending.get(msg.key)
            if fut is not None and not fut.done():
                fut.set_exception(RayUnavailable(msg.reason, retryable=not msg.final))
        elif isinstance(msg, m.Exited):
            link = self._links.get(msg.key)
            if link is not None:
                link.finish(msg.rc, msg.reason, msg.log_tail)

    def _lost(self, reason: str) -> None:
        self._set_status("disconnected", reason)
        self._connected.clear()
        self._lost_event.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RayUnavailable(reason))
        for link in list(self._links.values()):
            link.finish(None, f"{reason}; the worker on {link.node_text} was stopped with it")

    def _set_status(self, status: str, reason: str | None) -> None:
        if status == self.status and reason == self.reason:
            return
        self.status, self.reason = status, reason
        if status == "disconnected":
            log.warning("Ray cluster %s: %s", self.address, reason)
        self._publish(EventName.RAY_STATUS, None, status=status, address=self.address, reason=reason)

    def _publish(self, name: EventName, model: str | None, **fields: Any) -> None:
        if self._bus is not None:
            self._bus.publish(name, model, **fields)


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    interesting = [ln for ln in lines if "network_util.cc" not in ln]
    if not interesting:
        return ""
    # Ray's C++ log prefix ("[2026-01-01 12:00:00,000 E 123 456] rpc_client.h:204: ") says nothing here
    return re.sub(r"^\[[^\]]*\] [\w.]+:\d+: ", "", interesting[-1])[:300]
