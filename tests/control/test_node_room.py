"""NodeRoom, the Ray per-node budget (control/transport/ray/room.py), without Ray: claims
on no node and on their node, a load's reported memory for the next spawn of its shape."""

from __future__ import annotations

from corral import wire
from corral.control.transport.ray import messages as m
from corral.control.transport.ray.room import NodeRoom

GIB = 2**30


def node(nid: str, cpus: float = 4, memory: int = 4 * GIB) -> m.NodeView:
    return m.NodeView(node_id=nid, address="10.0.0.1", hostname=nid, alive=True, cpus=cpus, gpus=0,
                      memory=memory, memory_free=memory)


def settings(threads: int = 2) -> wire.WorkerSettings:
    return wire.WorkerSettings(model_id="m", model_path="/m.gguf", threads=threads, n_gpu_layers=0)


def test_claims_fill_the_nodes_then_room_for_says_why_not() -> None:
    room, nodes = NodeRoom(lambda s: GIB), [node("a"), node("b")]
    assert room.room_for(settings(), 4, nodes) is None  # 2 CPUs each: two per node
    for i in range(3):
        res = room.claim(f"k{i}", settings(), nodes)
        room.placed(f"k{i}", "a" if i < 2 else "b", res)
    assert room.room_for(settings(), 1, nodes) is None  # b has 2 CPUs left
    why = room.room_for(settings(), 2, nodes)
    assert why is not None and "CPU=2" in why and "memory=1024 MiB" in why
    room.forget("k0")
    assert room.room_for(settings(), 2, nodes) is None


def test_a_pending_claim_counts_and_a_reported_load_sizes_the_next_spawn() -> None:
    room, nodes = NodeRoom(lambda s: 3 * GIB), [node("a", cpus=16)]
    room.claim("k0", settings(), nodes)  # not placed yet: takes room somewhere
    assert room.room_for(settings(), 1, nodes) is not None  # 3 + 3 GiB > 4 GiB
    room.learned("k0", GIB)  # the worker reported 1 GiB: its shape asks that from now on
    assert room.resources_for(settings(), nodes).memory == GIB
    assert room.room_for(settings(), 1, nodes) is None
