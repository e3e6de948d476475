"""The Ray transport: model instances as Ray actors on the nodes of a Ray cluster.

Imported only when ``[server] ray_address`` (``corral serve --ray ADDRESS``) is set; it
imports no Ray itself. ``RayCluster`` is the router's connection: one bridge child
process (``python -m corral.cluster.bridge``, the Ray driver) spoken to with
``corral.cluster.messages``. ``RayCluster.spawn`` (the ``Spawner`` of
``corral.control.link``) asks the bridge for a ``WorkerHost`` actor; Ray places it on
a node with the resources asked (``num_cpus`` = threads, ``num_gpus`` when layers are
offloaded, ``memory`` = the model's estimated bytes, plus the model's
``ray_resources``); the actor starts ``python -m corral.worker`` there; the router then
connects straight to the worker (TCP to the node's address, first bytes a 32-byte token
the actor gave) and the same ``corral.wire`` frames flow as over the local socketpair.

Faults: the connection closing, the worker exiting, the actor or its node being lost
all end in ``WorkerLink.exited`` with a reason that names the node. The bridge dying
(the Ray connection lost) ends every Ray link the same way; ``status`` says so and the
cluster reconnects with backoff (1 s doubling to 30 s). Stopping the router closes the
bridge: Ray kills the actors it owns, and each worker dies with its actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from corral import wire
from corral.cluster import messages as m
from corral.control.events import EventBus
from corral.control.link import LinkExit, LinkOwner, Placement, WorkerLink
from corral.control.process import describe_exit

__all__ = ["RayCluster", "RayLink", "RayUnavailable", "actor_resources"]

log = logging.getLogger("corral.ray")

_CONNECT_TIMEOUT_S = 60.0
_EXIT_AFTER_CLOSE_S = 1.0  # channel closed and no exit report by then: the node is not answering
_MAX_BACKOFF_S = 30.0


class RayUnavailable(ConnectionError):
    """No connection to the Ray cluster now (an ``OSError``: the spawn failed)."""


def actor_resources(settings: wire.WorkerSettings, memory: int) -> m.ActorResources:
    """What one instance asks of Ray. Threads unset: one CPU (the worker then adapts
    its threads to the cores its node leaves free)."""
    threads = settings.threads or 1
    custom = dict(getattr(settings, "ray_resources", None) or {})
    return m.ActorResources(num_cpus=float(threads),
                            num_gpus=1.0 if settings.n_gpu_layers != 0 else 0.0,
                            memory=max(0, int(memory)), resources=custom)


def file_estimate(settings: wire.WorkerSettings) -> int:
    """Weights + KV when nothing better is known: the file size plus a quarter."""
    try:
        return int(os.path.getsize(settings.model_path) * 1.25)
    except OSError:
        return 0


class _Reader(asyncio.Protocol):
    def __init__(self, link: "RayLink") -> None:
        self._link = link

    def data_received(self, data: bytes) -> None:
        self._link.receive(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._link.channel_lost()


class RayLink(WorkerLink):
    """A worker on a Ray node: a TCP connection to it, and its actor (via the bridge)."""

    def __init__(self, owner: LinkOwner, cluster: "RayCluster", key: str, placed: m.Placed) -> None:
        super().__init__(owner, None)
        self.key = key
        self.placed = placed
        self._cluster = cluster
        self._pid: int | None = None
        self._transport: asyncio.Transport | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self._tail = ""
        self.node_text = f"node {placed.node_address} (id {placed.node_id[:12]})"

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        p = self.placed
        sock = socket.socket(socket.AF_INET6 if ":" in p.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, (p.host, p.port)), 10.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_sendall(sock, p.token)
            transport, _ = await loop.connect_accepted_socket(lambda: _Reader(self), sock)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            self.kill()
            raise RayUnavailable(f"cannot connect to the worker on {self.node_text} "
                                 f"port {p.port}: {exc or type(exc).__name__}") from None
        self._transport = transport

    # ------------------------------------------------------------ WorkerLink

    @property
    def placement(self) -> Placement:
        return Placement(pid=self._pid, node_id=self.placed.node_id,
                         node_address=self.placed.node_address)

    @property
    def is_open(self) -> bool:
        t = self._transport
        return t is not None and not t.is_closing()

    def _write(self, frame: bytes) -> None:
        if self._transport is not None:
            self._transport.write(frame)

    def deliver(self, msg: wire.FromWorker) -> None:
        if isinstance(msg, (wire.Loading, wire.Ready)):
            self._pid = msg.pid
        super().deliver(msg)

    def terminate(self) -> None:
        self.kill()  # a remote worker has no gentler signal than its actor's end

    def kill(self) -> None:
        if self.exit is None:
            self._cluster.kill(self.key)

    def log_tail(self) -> str:
        return self._tail

    # ------------------------------------------------------------ events

    def channel_lost(self) -> None:
        self._transport = None
        self.closed()
        if self.exit is None:
            # The worker exited (its report is on the way) or its node stopped answering.
            self._close_timer = asyncio.get_running_loop().call_later(
                _EXIT_AFTER_CLOSE_S, self._no_exit_report)

    def _no_exit_report(self) -> None:
        if self.exit is None:
            self.kill()
            self.finish(None, f"lost the connection to the worker on {self.node_text}")

    def finish(self, rc: int | None, reason: str | None, tail: str = "") -> None:
        """The worker is gone (exit report, actor or node lost, Ray connection lost)."""
        if self._close_timer is not None:
            self._close_timer.cancel()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        self._tail = tail
        self._cluster.forget(self.key)
        if reason is None:
            reason = f"{describe_exit(rc)} on {self.node_text}"
        self.exited(LinkExit(rc, reason))


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
        self._estimate = estimate
        self._bridge_command = bridge_command or [sys.executable, "-m", "corral.cluster.bridge"]
        self._router_id = f"{socket.gethostname()}-{os.getpid()}"
        self._seq = itertools.count(1)
        self._proc: asyncio.subprocess.Process | None = None
        self._pending: dict[str, asyncio.Future[m.Placed]] = {}
        self._links: dict[str, RayLink] = {}
        self._connected: asyncio.Event = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._closing = False
        self._failures = 0

    # ------------------------------------------------------------ lifecycle

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
                "reason": self.reason, "ray_version": self.ray_version,
                "nodes": [msgspec.structs.asdict(n) for n in self.nodes]}

    def node_address(self, node_id: str | None) -> str | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n.address
        return None

    # ------------------------------------------------------------ Spawner

    async def spawn(self, settings: wire.WorkerSettings, owner: LinkOwner) -> RayLink:
        if self.status != "connected":
            raise RayUnavailable(f"not connected to the Ray cluster at {self.address}"
                                 + (f": {self.reason}" if self.reason else ""))
        key = f"{self._router_id}/{settings.model_id}#{settings.instance}.{next(self._seq)}"
        res = actor_resources(settings, self._estimate(settings))
        fut: asyncio.Future[m.Placed] = asyncio.get_running_loop().create_future()
        self._pending[key] = fut
        self._send(m.Spawn(key=key, settings_json=msgspec.json.encode(settings).decode(),
                           worker_command=self._worker_command, resources=res,
                           place_timeout_s=self._place_timeout_s))
        try:
            placed = await fut
        finally:
            self._pending.pop(key, None)
        link = RayLink(owner, self, key, placed)
        self._links[key] = link
        self._publish("ray_placed", settings.model_id, instance=settings.instance,
                      node_id=placed.node_id, node_address=placed.node_address,
                      hostname=placed.hostname)
        await link.connect()
        return link

    def kill(self, key: str) -> None:
        with contextlib.suppress(RayUnavailable):
            self._send(m.Kill(key))

    def forget(self, key: str) -> None:
        self._links.pop(key, None)

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
            self._lost(reason)
            if time.monotonic() - started > _MAX_BACKOFF_S:
                self._failures = 0
            self._failures += 1
            await asyncio.sleep(min(_MAX_BACKOFF_S, 2 ** (self._failures - 1)))

    async def _bridge_session(self) -> str:
        """Run one bridge until it exits; return why it ended, in words."""
        self._set_status("connecting", None)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self._log_dir / "ray-bridge.log"
        with open(log_path, "ab") as log_file:
            self._proc = await asyncio.create_subprocess_exec(
                *self._bridge_command, "--address", self.address, "--namespace", self.namespace,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log_file,
                env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"})
        assert self._proc.stdout is not None
        dec = wire.FrameDecoder(m.MAX_FRAME)
        try:
            while True:
                data = await self._proc.stdout.read(1 << 16)
                if not data:
                    break
                for body in dec.feed(data):
                    self._on_message(m.decode_from_bridge(body))
        except (msgspec.DecodeError, wire.FrameTooLarge) as exc:
            log.error("bad message from the Ray bridge: %s", exc)
        rc = await self._stop_bridge()
        tail = _last_line(log_path)
        if self.status == "connected":
            return f"lost the connection to the Ray cluster ({tail or describe_exit(rc)})"
        return tail or f"the Ray bridge ended: {describe_exit(rc)}"

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
            self._set_status("connected", None)
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
                fut.set_exception(RayUnavailable(msg.reason))
        elif isinstance(msg, m.Exited):
            link = self._links.get(msg.key)
            if link is not None:
                link.finish(msg.rc, msg.reason, msg.log_tail)

    def _lost(self, reason: str) -> None:
        self._set_status("disconnected", reason)
        self._connected.clear()
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
        self._publish("ray_status", None, status=status, address=self.address, reason=reason)

    def _publish(self, name: str, model: str | None, **fields: Any) -> None:
        if self._bus is not None:
            self._bus.publish(name, model, **fields)


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    interesting = [ln for ln in lines if "network_util.cc" not in ln]
    return interesting[-1][:300] if interesting else ""
