"""The Ray transport below the router: placement by resources, frames both ways, and
each way a worker can be lost (its process, its actor, its node), on a real 2-node
cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from corral import wire
from corral.control.transport.link import LinkExit, WorkerLink
from corral.control.transport.ray.cluster import RayCluster
from corral.control.transport.ray.link import RayUnavailable

from .conftest import TAG, Nodes, corral_workers

pytestmark = pytest.mark.integration


class Owner:
    def __init__(self) -> None:
        self.events: asyncio.Queue[Any] = asyncio.Queue()

    def link_message(self, link: WorkerLink, msg: Any) -> None:
        self.events.put_nowait(msg)

    def link_request_ended(self, link: WorkerLink) -> None:
        pass

    def link_closed(self, link: WorkerLink) -> None:
        self.events.put_nowait("closed")

    def link_exited(self, link: WorkerLink, exit: LinkExit) -> None:
        self.events.put_nowait(exit)

    async def next(self, kind: type | str, timeout: float = 60) -> Any:
        while True:
            ev = await asyncio.wait_for(self.events.get(), timeout)
            if (isinstance(kind, str) and ev == kind) or (isinstance(kind, type) and isinstance(ev, kind)):
                return ev


def settings(model_path: Path, name: str, **kw: Any) -> wire.WorkerSettings:
    base: dict[str, Any] = {"model_id": f"{TAG}{name}-{uuid.uuid4().hex[:6]}",
                            "model_path": str(model_path), "threads": 1, "n_parallel": 2,
                            "ctx_len": 512}
    base.update(kw)
    return wire.WorkerSettings(**base)


async def connect(nodes: Nodes, tmp_path: Path) -> RayCluster:
    rc = RayCluster(nodes.address, "corral-test", log_dir=tmp_path / "logs")
    await rc.start(wait_s=60)
    assert rc.status == "connected", rc.reason
    return rc


def node_id(rc: RayCluster, resource: str) -> str:
    return next(n.node_id for n in rc.nodes if resource in n.resources and n.alive)


async def generate(link: WorkerLink, owner: Owner, rid: str) -> str:
    """Runs a request through the link's frames (no router above it)."""
    got: list[str] = []
    done = asyncio.get_running_loop().create_future()

    class Stream:  # what the link reads of a RequestStream
        instance = None
        started = 0.0
        first_token: float | None = None

        def bind(self, *a: Any) -> None:
            pass

        def on_delta(self, d: wire.Delta) -> None:
            self.first_token = self.first_token or time.perf_counter()
            got.append(d.text)

        def on_end(self, msg: Any) -> None:
            done.set_result(msg)

        def fail(self, exc: Exception) -> None:
            done.set_exception(exc)

    req = wire.GenerateRequest(id=rid, prompt="Hello", params=wire.SamplingParams(max_tokens=4, ignore_eos=True))
    assert link.submit(rid, wire.encode(req), Stream(), 0)  # type: ignore[arg-type]
    end = await asyncio.wait_for(done, 60)
    assert isinstance(end, wire.Finished), end
    return "".join(got)


async def test_placed_by_resources_and_killed_three_ways(cluster: Nodes, tmp_path: Path, model_path: Path) -> None:
    rc = await connect(cluster, tmp_path)
    try:
        a, b = Owner(), Owner()
        s_a = settings(model_path, "a", ray_resources={"node_a": 1})
        link_a = await rc.spawn(s_a, a)
        s_b = settings(model_path, "b", ray_resources={"node_b": 1})
        link_b = await rc.spawn(s_b, b)
        await a.next(wire.Ready)
        await b.next(wire.Ready)
        assert link_a.placement.node_id == node_id(rc, "node_a")
        assert link_b.placement.node_id == node_id(rc, "node_b")
        assert link_a.placement.node_address == "127.0.0.1"
        assert await generate(link_a, a, "r1") and await generate(link_b, b, "r2")

        # 1. the worker process dies: exit code and the node in the reason
        os.kill(link_b.placement.pid or 0, signal.SIGKILL)
        await b.next("closed")
        ex = await b.next(LinkExit)
        assert ex.code == -signal.SIGKILL and "SIGKILL" in ex.reason and "127.0.0.1" in ex.reason
        assert await generate(link_a, a, "r3")  # the other node serves on

        # 2. the actor dies (its worker with it)
        b2 = Owner()
        link_b = await rc.spawn(s_b, b2)
        await b2.next(wire.Ready)
        worker = link_b.placement.pid
        os.kill(link_b.placed.actor_pid, signal.SIGKILL)
        ex = await b2.next(LinkExit)
        assert ex.code is None and "127.0.0.1" in ex.reason, ex
        await _gone(worker)

        # 3. the whole node is lost
        b3 = Owner()
        link_b = await rc.spawn(s_b, b3)
        await b3.next(wire.Ready)
        worker = link_b.placement.pid
        lost = link_b.placement.node_id
        cluster.kill("node_b")
        ex = await b3.next(LinkExit)
        assert ex.code is None and "the node died" in ex.reason and (lost or "")[:12] in ex.reason, ex
        await _gone(worker)
        assert await generate(link_a, a, "r4")
        with pytest.raises(RayUnavailable, match="node_b") as err:  # pinned to a node that is gone
            await rc.spawn(s_b, Owner())
        assert not err.value.retryable
        # unpinned, it comes back where there is room (node_a is full: 1 CPU, so it waits for node_b)
        back = Owner()
        spawn = asyncio.ensure_future(rc.spawn(settings(model_path, "c"), back))
        cluster.ensure_both()
        link_c = await asyncio.wait_for(spawn, 90)
        await back.next(wire.Ready)
        assert link_c.placement.node_id not in (lost, link_a.placement.node_id)
        assert await generate(link_c, back, "r5")
    finally:
        await rc.close()
    assert not corral_workers(TAG), "a worker outlived its router's Ray connection"


async def test_unplaceable_is_a_clear_error(cluster: Nodes, tmp_path: Path, model_path: Path) -> None:
    rc = await connect(cluster, tmp_path)
    try:
        with pytest.raises(RayUnavailable, match="no node of the Ray cluster has CPU=3"):
            await rc.spawn(settings(model_path, "big", threads=3), Owner())
    finally:
        await rc.close()


async def _gone(pid: int | None, timeout: float = 30) -> None:
    assert pid is not None
    for _ in range(int(timeout / 0.1)):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        await asyncio.sleep(0.1)  # a process exit offers nothing to await across machines
    raise AssertionError(f"worker {pid} still runs")


async def test_lost_bridge_ends_its_workers_and_reconnects(cluster: Nodes, tmp_path: Path, model_path: Path) -> None:
    """The bridge (the Ray driver) dying is the Ray connection lost: Ray kills the actors
    it owned, their workers die with them, the links fail with a clear reason, and the
    cluster connection comes back by itself."""
    rc = await connect(cluster, tmp_path)
    try:
        o = Owner()
        link = await rc.spawn(settings(model_path, "bridge"), o)
        await o.next(wire.Ready)
        worker = link.placement.pid
        assert rc._proc is not None
        rc._proc.kill()
        ex = await o.next(LinkExit)
        assert "lost the connection to the Ray cluster" in ex.reason and "127.0.0.1" in ex.reason, ex
        assert rc.status in ("disconnected", "connecting")
        await _gone(worker)
        await asyncio.wait_for(rc._connected.wait(), 60)
        assert rc.status == "connected"
        o2 = Owner()
        await rc.spawn(settings(model_path, "again"), o2)
        await o2.next(wire.Ready)
    finally:
        await rc.close()
    assert not corral_workers(TAG)
