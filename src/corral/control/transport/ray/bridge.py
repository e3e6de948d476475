"""The router's Ray driver, in a child process of its own.

    python -m corral.control.transport.ray.bridge --address ADDRESS [--namespace NS]

Reads ``corral.control.transport.ray.messages`` from stdin, writes them to stdout (nothing else goes
there; Ray's own logging goes to stderr). One ``WorkerHost`` actor per ``Spawn``:
resources from the message, ``scheduling_strategy="SPREAD"`` (instances of a model go
to different nodes when they can), no Ray restarts (the router restarts instances
itself, with backoff). Every actor is owned by this driver: when the bridge dies (the
router died: ``PR_SET_PDEATHSIG``; or its Ray connection was lost) Ray kills the actors
and each worker dies with its actor. The router starts a new bridge to reconnect.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

import ray as _ray_typed

from corral.control.transport.ray import messages as m
from corral.control.transport.ray.host import WorkerHost
from corral.children.frames import FrameDecoder

log = logging.getLogger("corral.control.transport.ray.bridge")

ray: Any = _ray_typed  # Ray's own annotations are partial; this module is its one driver

_NODES_EVERY_S = 2.0


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def node_views(claimed: dict[str, int]) -> list[m.NodeView]:
    """ray.nodes() in corral's words; ``claimed``: memory our actors hold per node id."""
    out = []
    for n in ray.nodes():
        res: dict[str, float] = dict(n.get("Resources") or {})
        memory = int(res.get("memory", 0))
        custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")
                  and not k.startswith("node:") and not k.startswith("accelerator_type:")}
        out.append(m.NodeView(
            node_id=str(n["NodeID"]), address=str(n.get("NodeManagerAddress", "")),
            hostname=str(n.get("NodeManagerHostname", "")), alive=bool(n.get("Alive")),
            cpus=float(res.get("CPU", 0)), gpus=float(res.get("GPU", 0)), memory=memory,
            memory_free=max(0, memory - claimed.get(str(n["NodeID"]), 0)), resources=custom))
    return out


def describe_node(nodes: list[m.NodeView], node_id: str) -> str:
    for n in nodes:
        if n.node_id == node_id:
            return f"node {n.address} ({n.hostname}, id {node_id[:12]})"
    return f"node id {node_id[:12]}"


def unplaceable(res: m.ActorResources, nodes: list[m.NodeView]) -> str | None:
    """Why no live node could ever hold this actor, or None."""
    need: dict[str, float] = {"CPU": res.num_cpus, "GPU": res.num_gpus, "memory": float(res.memory),
                              **res.resources}
    alive = [n for n in nodes if n.alive]
    for n in alive:
        have = {"CPU": n.cpus, "GPU": n.gpus, "memory": float(n.memory), **n.resources}
        if all(have.get(k, 0.0) >= v for k, v in need.items() if v > 0):
            return None
    asked = ", ".join(f"{k}={v:g}" for k, v in need.items() if v > 0)
    return (f"no node of the Ray cluster has {asked} ({len(alive)} live node(s)); "
            "check threads, n_gpu_layers, the model's memory and ray_resources")


class Bridge:
    def __init__(self, out: Any) -> None:
        self._out = out
        self._write_lock = threading.Lock()
        self._actors: dict[str, Any] = {}
        self._claimed: dict[str, tuple[str, int]] = {}  # key -> (node id, memory)
        self._nodes: list[m.NodeView] = []
        self._actor_cls = ray.remote(WorkerHost)

    def send(self, msg: m.FromBridge) -> None:
        data = m.encode(msg)
        with self._write_lock:
            self._out.write(data)
            self._out.flush()

    def claimed(self) -> dict[str, int]:
        per: dict[str, int] = {}
        for node_id, mem in self._claimed.values():
            per[node_id] = per.get(node_id, 0) + mem
        return per

    async def refresh_nodes(self, *, always: bool = False) -> None:
        nodes = await asyncio.to_thread(node_views, self.claimed())
        if always or nodes != self._nodes:
            self._nodes = nodes
            self.send(m.Nodes(nodes))

    async def watch_nodes(self) -> None:
        while True:
            await asyncio.sleep(_NODES_EVERY_S)
            await self.refresh_nodes()

    async def spawn(self, msg: m.Spawn) -> None:
        why = unplaceable(msg.resources, self._nodes)
        if why is not None:
            await self.refresh_nodes()  # maybe a node joined
            why = unplaceable(msg.resources, self._nodes)
        if why is not None:
            self.send(m.SpawnFailed(msg.key, why, final=True))
            return
        r = msg.resources
        opts: dict[str, Any] = {"num_cpus": r.num_cpus, "max_restarts": 0, "max_concurrency": 4,
                                "name": f"corral-worker/{msg.key}", "scheduling_strategy": "SPREAD"}
        if r.num_gpus > 0:
            opts["num_gpus"] = r.num_gpus
        if r.memory > 0:
            opts["memory"] = r.memory
        if r.resources:
            opts["resources"] = dict(r.resources)
        actor = self._actor_cls.options(**opts).remote(msg.key, msg.settings_json, msg.worker_command)
        self._actors[msg.key] = actor
        try:
            info = await asyncio.wait_for(actor.place.remote(), msg.place_timeout_s)
        except asyncio.TimeoutError:
            self._drop(msg.key)
            self.send(m.SpawnFailed(msg.key, f"no node of the Ray cluster had room within "
                                              f"{msg.place_timeout_s:g} s"))
            return
        except Exception as exc:  # noqa: BLE001 - any Ray error is the reason
            self._drop(msg.key)
            self.send(m.SpawnFailed(msg.key, f"the Ray actor could not start: {_short(exc)}"))
            return
        if msg.key not in self._actors:  # killed meanwhile
            return
        self._claimed[msg.key] = (info["node_id"], r.memory)
        self.send(m.Placed(key=msg.key, **info))
        await self.refresh_nodes()
        await self._wait_exit(msg.key, actor, info["node_id"])

    async def _wait_exit(self, key: str, actor: Any, node_id: str) -> None:
        try:
            rc, failure, tail, pid = await actor.wait_exit.remote()
            self.send(m.Exited(key=key, rc=rc, reason=failure, log_tail=tail, worker_pid=pid))
        except Exception as exc:  # noqa: BLE001 - the actor or its node is gone
            await self.refresh_nodes()
            where = describe_node(self._nodes, node_id)
            alive = any(n.alive for n in self._nodes if n.node_id == node_id)
            text = str(exc)
            if not alive or "node has died" in text:
                reason = f"lost {where}: the node died or left the Ray cluster"
            else:
                reason = f"lost the worker's Ray actor on {where}: {_actor_death(text)}"
            self.send(m.Exited(key=key, rc=None, reason=reason))
        self._drop(key)
        await self.refresh_nodes()

    def kill(self, key: str) -> None:
        actor = self._actors.get(key)
        if actor is None:
            return
        try:
            actor.kill.remote()  # the worker's group first, then the actor itself
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001
            log.exception("killing actor %s", key)

    def _drop(self, key: str) -> None:
        actor = self._actors.pop(key, None)
        self._claimed.pop(key, None)
        if actor is not None:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def _actor_death(text: str) -> str:
    """Ray's actor-death text, without its boilerplate first sentence and ids."""
    text = " ".join(text.split())
    for marker in ("The actor died because", "The actor is dead because"):
        if marker in text:
            return text[text.index(marker):][:200]
    return text[:200]


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


async def _serve(bridge: Bridge, address: str, namespace: str) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    await bridge.refresh_nodes(always=False)
    bridge.send(m.Connected(address=address, namespace=namespace, ray_version=ray.__version__,
                            nodes=bridge._nodes))
    tasks: set[asyncio.Task[None]] = set()
    tasks.add(loop.create_task(bridge.watch_nodes()))
    dec = FrameDecoder(m.MAX_FRAME)
    while True:
        data = await reader.read(1 << 16)
        if not data:
            return  # the router closed our stdin: it is going away
        for body in dec.feed(data):
            msg = m.decode_to_bridge(body)
            if isinstance(msg, m.Spawn):
                task = loop.create_task(bridge.spawn(msg))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            else:
                bridge.kill(msg.key)


def unreachable_head(address: str, timeout_s: float = 3.0) -> str | None:
    """Why the head at ``HOST:PORT`` or ``ray://HOST:PORT`` refuses a TCP connection, or
    None (``auto``, or it answers). Checked before ``ray.init``, which retries an absent
    head for its whole GCS timeout: a reconnect attempt then fails in moments."""
    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout_s).close()
    except OSError as exc:
        return f"cannot reach the Ray head at {hostport}: {exc.strerror or exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m corral.control.transport.ray.bridge")
    ap.add_argument("--address", required=True)
    ap.add_argument("--namespace", default="corral")
    args = ap.parse_args(argv)
    _die_with_parent()
    logging.basicConfig(level=logging.INFO, format="ray-bridge: %(message)s", stream=sys.stderr)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints must not corrupt frames
    why = unreachable_head(args.address)
    if why is not None:
        print(why, file=sys.stderr)
        return 3
    try:
        ray.init(address=args.address, namespace=args.namespace, logging_level=logging.WARNING,
                 log_to_driver=False, configure_logging=False)
    except Exception as exc:  # noqa: BLE001 - the router shows this line as the status
        print(f"cannot connect to the Ray cluster at {args.address}: {_short(exc)}", file=sys.stderr)
        return 3
    # A SIGTERM to the router's process group (systemd, a terminal) would end this driver
    # (Ray's handler) before the router closes our stdin; the router stops it in order
    # (stdin closed: actors killed), and it dies with the router anyway.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    bridge = Bridge(out)
    try:
        asyncio.run(_serve(bridge, args.address, args.namespace))
    finally:
        for key in list(bridge._actors):
            bridge._drop(key)
        try:
            ray.shutdown()  # a ray:// client disconnects now: no grace period for its actors
        except Exception:  # noqa: BLE001 - the cluster is gone already
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
