"""The per-node budget of a Ray cluster: what corral's instances hold on each node.

Each spawn claims what it asks of Ray (``m.ActorResources``: CPUs, GPUs, memory, custom
resources), first on no node, then on the node Ray placed it on, until its worker is
forgotten. An instance's memory is what the last load of the same shape (model, context,
slots, GPU layers) reported, else the file estimate. ``room_for`` answers admission: do
``count`` more instances fit on the live nodes next to those claims (a load that fits no
node evicts idle models)? Pure bookkeeping: no Ray import, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from corral import wire
from corral.control.transport.ray import messages as m
from corral.control.transport.ray.link import actor_resources

__all__ = ["NodeRoom"]


class NodeRoom:
    def __init__(self, estimate: Callable[[wire.WorkerSettings], int]) -> None:
        self._estimate = estimate
        self._memory: dict[tuple[Any, ...], int] = {}  # what a load with these settings reported
        self._shape: dict[str, tuple[Any, ...]] = {}  # spawn key -> its settings' memory shape
        self._claims: dict[str, tuple[str | None, m.ActorResources]] = {}  # key -> (node id, asked)

    def resources_for(self, settings: wire.WorkerSettings, nodes: Sequence[m.NodeView]) -> m.ActorResources:
        """What an instance with these settings asks of Ray (memory: what the last load
        of the same shape reported, else the file estimate)."""
        known = self._memory.get(_memory_shape(settings))
        gpus = any(n.alive and n.gpus > 0 for n in nodes)
        return actor_resources(settings, known or self._estimate(settings), cluster_has_gpus=gpus)

    def claim(self, key: str, settings: wire.WorkerSettings, nodes: Sequence[m.NodeView]) -> m.ActorResources:
        """A spawn (``key``) asks for its resources, on no node yet; returns them."""
        self._shape[key] = _memory_shape(settings)
        res = self.resources_for(settings, nodes)
        self._claims[key] = (None, res)
        return res

    def placed(self, key: str, node_id: str | None, res: m.ActorResources) -> None:
        self._claims[key] = (node_id, res)

    def forget(self, key: str) -> None:
        self._shape.pop(key, None)
        self._claims.pop(key, None)

    def room_for(self, settings: wire.WorkerSettings, count: int, nodes: Sequence[m.NodeView]) -> str | None:
        """None when ``count`` more instances with these settings fit on the live ``nodes``
        next to what corral's instances hold there (CPUs, GPUs, memory, custom
        resources); else why not, for the capacity error."""
        free = {n.node_id: _capacity(n) for n in nodes if n.alive}
        pending = []
        for node_id, res in self._claims.values():
            if node_id in free:
                _take(free[node_id], res)
            elif node_id is None:
                pending.append(res)
        want = self.resources_for(settings, nodes)
        for res in [*pending, *[want] * count]:
            node = next((nid for nid, cap in free.items() if _fits(cap, res)), None)
            if node is None:
                if res is not want:
                    continue  # a pending spawn Ray may place elsewhere: not our question
                return (f"no node of the Ray cluster has room for another instance "
                        f"({_describe(want)}) next to the instances corral runs there")
            _take(free[node], res)
        return None

    def learned(self, key: str, memory: int) -> None:
        """A worker reported its weights + KV: the next spawn of that shape asks for it."""
        shape = self._shape.get(key)
        if shape is not None and memory > 0:
            self._memory[shape] = memory


def _capacity(n: m.NodeView) -> dict[str, float]:
    return {"CPU": n.cpus, "GPU": n.gpus, "memory": float(n.memory), **n.resources}


def _asks(res: m.ActorResources) -> dict[str, float]:
    return {"CPU": res.num_cpus, "GPU": res.num_gpus, "memory": float(res.memory), **res.resources}


def _fits(cap: dict[str, float], res: m.ActorResources) -> bool:
    return all(cap.get(k, 0.0) >= v for k, v in _asks(res).items() if v > 0)


def _take(cap: dict[str, float], res: m.ActorResources) -> None:
    for k, v in _asks(res).items():
        cap[k] = cap.get(k, 0.0) - v


def _describe(res: m.ActorResources) -> str:
    return ", ".join(f"{k}={v / 2**20:.0f} MiB" if k == "memory" else f"{k}={v:g}"
                     for k, v in _asks(res).items() if v > 0)


def _memory_shape(s: wire.WorkerSettings) -> tuple[Any, ...]:
    return (s.model_path, s.ctx_len, s.n_parallel, s.n_gpu_layers, s.embedding)
