"""RayCluster while its Ray connection is lost: requests waiting for a Ray instance get a
503 ``cluster_unreachable`` at once (no Ray needed: the status is driven by hand; the
real head restart is in tests/ray_cluster/test_cluster_connection.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.control.transport.ray.cluster import RayCluster
from corral.errors import ClusterUnreachable


def cluster(tmp_path: Path) -> RayCluster:
    return RayCluster("10.0.0.1:6379", "corral", log_dir=tmp_path)


async def test_connected_or_connecting_is_not_unreachable(tmp_path: Path) -> None:
    rc = cluster(tmp_path)
    assert rc.status == "connecting" and rc.unreachable() is None
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    await rc.while_reachable(done)  # passes through


async def test_disconnected_is_a_503_with_the_reason_and_attempts(tmp_path: Path) -> None:
    rc = cluster(tmp_path)
    rc._lost("lost the connection to the Ray cluster (GCS gone)")
    rc.attempts = 2
    err = rc.unreachable()
    assert isinstance(err, ClusterUnreachable)
    assert err.status == 503 and err.code == "cluster_unreachable"
    assert "10.0.0.1:6379" in err.message and "GCS gone" in err.message and "2 attempt" in err.message
    assert err.headers()["Retry-After"] == "5"
    view = rc.view()
    assert view["status"] == "disconnected" and view["reconnect_attempts"] == 2

    async def never() -> None:
        await asyncio.Event().wait()

    with pytest.raises(ClusterUnreachable):
        await rc.while_reachable(never())


async def test_a_waiting_request_fails_when_the_connection_is_lost(tmp_path: Path) -> None:
    rc = cluster(tmp_path)
    rc.status = "connected"
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def wait_for_instance() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiter = asyncio.ensure_future(rc.while_reachable(wait_for_instance()))
    await started.wait()
    assert not waiter.done()
    rc._lost("lost the connection to the Ray cluster (head gone)")
    with pytest.raises(ClusterUnreachable, match="head gone"):
        await waiter
    assert cancelled.is_set(), "the inner wait was left running"
