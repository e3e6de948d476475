"""Typed messages between the router and its Ray bridge process (``corral.control.transport.ray.bridge``).

The bridge is the router's one Ray driver: a child process (``python -m
corral.control.transport.ray.bridge``) so that Ray's client library, its threads and its failures stay
out of the router process. The router writes to the bridge's stdin and reads its stdout.
Framing as in ``corral.wire``: 4-byte big-endian length + msgpack of a tagged struct.

    router                                      bridge (Ray driver)
      | ---- spawn (address, namespace) -------> |  ray.init
      | <--------- Connected | (exit) ---------- |
      | -------- Spawn(key, settings, res) ----> |  create a WorkerHost actor
      | <------ Placed | SpawnFailed ----------- |  (node, address + token of the worker)
      | <------ Exited(key, rc, reason) -------- |  worker exited, or actor/node lost
      | -------- Kill(key) --------------------> |  ray.kill the actor (its worker dies)
      | <------ Nodes([...]) ------------------- |  on change, and every few seconds

No Ray import here: the router imports this module only to speak to the bridge.
"""

from __future__ import annotations

from typing import Union

import msgspec

from corral.children.frames import frame

__all__ = [
    "ActorResources", "Spawn", "Kill", "Connected", "Placed", "SpawnFailed", "Exited",
    "NodeView", "Nodes", "ToBridge", "FromBridge", "encode", "decode_to_bridge",
    "decode_from_bridge", "MAX_FRAME",
]

MAX_FRAME = 4 << 20


class ActorResources(msgspec.Struct, frozen=True, kw_only=True):
    """What one instance asks of Ray: ``num_cpus`` = its threads, ``num_gpus`` from its
    GPU settings, ``memory`` = its estimated bytes, ``resources`` = the model's
    ``ray_resources`` (custom resources, e.g. a node tag)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int = 0
    resources: dict[str, float] = {}


# ---------------------------------------------------------------- router -> bridge


class Spawn(msgspec.Struct, frozen=True, tag="spawn", kw_only=True):
    key: str  # unique per spawn; also part of the actor's name
    settings_json: str  # wire.WorkerSettings as JSON, handed to the worker unchanged
    worker_command: list[str] | None = None  # None: python -m corral.worker on the node
    resources: ActorResources = ActorResources()
    place_timeout_s: float = 300.0


class Kill(msgspec.Struct, frozen=True, tag="kill"):
    key: str


ToBridge = Union[Spawn, Kill]


# ---------------------------------------------------------------- bridge -> router


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    address: str
    hostname: str
    alive: bool
    cpus: float
    gpus: float
    memory: int  # the node's Ray `memory` resource: the per-node budget
    memory_free: int  # of it, not claimed by actors now
    resources: dict[str, float] = {}  # custom resources (node tags)


class Connected(msgspec.Struct, frozen=True, tag="connected", kw_only=True):
    address: str
    namespace: str
    ray_version: str
    nodes: list[NodeView]


class Placed(msgspec.Struct, frozen=True, tag="placed", kw_only=True):
    key: str
    node_id: str
    node_address: str
    hostname: str
    host: str  # where the worker's connection listens (the node's address)
    port: int
    token: bytes  # the first bytes the router sends on that connection
    actor_pid: int
    log_path: str  # on that node


class SpawnFailed(msgspec.Struct, frozen=True, tag="spawn_failed"):
    key: str
    reason: str
    final: bool = False  # no node could ever hold it (else: no room now, or a Ray error)


class Exited(msgspec.Struct, frozen=True, tag="exited", kw_only=True):
    key: str
    rc: int | None  # the worker's exit status; None: unknown (actor or node lost)
    reason: str | None = None  # set when the actor or its node was lost
    log_tail: str = ""
    worker_pid: int | None = None


class Nodes(msgspec.Struct, frozen=True, tag="nodes"):
    nodes: list[NodeView]


FromBridge = Union[Connected, Placed, SpawnFailed, Exited, Nodes]

_encoder = msgspec.msgpack.Encoder()
_to_bridge = msgspec.msgpack.Decoder(ToBridge)
_from_bridge = msgspec.msgpack.Decoder(FromBridge)


def encode(msg: ToBridge | FromBridge) -> bytes:
    return frame(_encoder.encode(msg), MAX_FRAME)


def decode_to_bridge(body: bytes) -> ToBridge:
    return _to_bridge.decode(body)


def decode_from_bridge(body: bytes) -> FromBridge:
    return _from_bridge.decode(body)
