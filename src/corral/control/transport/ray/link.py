"""The Ray transport: model instances as Ray actors on the nodes of a Ray cluster.

Imported only when ``[server] ray_address`` (``corral serve --ray ADDRESS``) is set; it
imports no Ray itself. ``RayCluster`` (``corral.control.transport.ray.cluster``) is the router's connection: one bridge child
process (``python -m corral.control.transport.ray.bridge``, the Ray driver) spoken to with
``corral.control.transport.ray.messages``. ``RayCluster.spawn`` (the ``Spawner`` of
``corral.control.transport.link``) asks the bridge for a ``WorkerHost`` actor; Ray places it on
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
import logging
import os
import socket
from typing import Protocol

from corral import wire
from corral.control.transport.ray import messages as m
from corral.children.exits import describe_exit
from corral.control.transport.link import FrameReader, LinkExit, LinkOwner, Placement, WorkerLink

__all__ = ["RayLink", "ActorControl", "RayUnavailable", "actor_resources", "file_estimate"]

log = logging.getLogger("corral.ray")

_EXIT_AFTER_CLOSE_S = 1.0  # channel closed and no exit report by then: the node is not answering


class RayUnavailable(ConnectionError):
    """The spawn failed (an ``OSError``). ``retryable``: it may work later (no connection
    or no room now); False when no node of the cluster could ever hold the instance."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def actor_resources(settings: wire.WorkerSettings, memory: int, *, cluster_has_gpus: bool) -> m.ActorResources:
    """What one instance asks of Ray. Threads unset: one CPU (the worker then adapts
    its threads to the cores its node leaves free). A GPU when layers are offloaded
    (``n_gpu_layers`` a number other than 0, or ``auto`` on a cluster that has GPUs;
    ``devices`` asks for that many)."""
    threads = settings.threads or 1
    layers = settings.n_gpu_layers
    wants_gpu = layers != 0 and (layers != "auto" or cluster_has_gpus)
    gpus = float(len(settings.devices)) if settings.devices else 1.0
    custom = dict(getattr(settings, "ray_resources", None) or {})
    return m.ActorResources(num_cpus=float(threads), num_gpus=gpus if wants_gpu else 0.0,
                            memory=max(0, int(memory)), resources=custom)


def file_estimate(settings: wire.WorkerSettings) -> int:
    """Weights + KV when nothing better is known: the file size plus a quarter."""
    try:
        return int(os.path.getsize(settings.model_path) * 1.25)
    except OSError:
        return 0


class ActorControl(Protocol):
    """What a link asks of the cluster about its actor, by key (``RayCluster`` is one)."""

    def learned(self, key: str, memory: int) -> None: ...

    def kill(self, key: str) -> None: ...

    def forget(self, key: str) -> None: ...


class RayLink(WorkerLink):
    """A worker on a Ray node: a TCP connection to it, and its actor (via the bridge)."""

    def __init__(self, owner: LinkOwner, cluster: ActorControl, key: str, placed: m.Placed) -> None:
        super().__init__(owner, None)
        self.key = key
        self.placed = placed
        self._cluster = cluster
        self._pid: int | None = None
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
            transport, _ = await loop.connect_accepted_socket(
                lambda: FrameReader(self.receive, self.channel_lost), sock)
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

    def deliver(self, msg: wire.FromWorker) -> None:
        if isinstance(msg, (wire.Loading, wire.Ready)):
            self._pid = msg.pid
        if isinstance(msg, wire.Ready):
            self._cluster.learned(self.key, msg.info.model_bytes + msg.info.kv_bytes)
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
            reason = f"worker {describe_exit(rc)} on {self.node_text}"
        self.exited(LinkExit(rc, reason))
