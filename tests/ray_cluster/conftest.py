"""The Ray test group: a real 2-node Ray cluster on this machine, inside a network
namespace that has only ``lo``.

Ray sends traffic on its own (it learns its address by connecting to 8.8.8.8:53, even
with ``--node-ip-address 127.0.0.1``), and no test may send anything beyond loopback.
So the cluster tests (``test_cluster_*.py``) are collected only inside such a namespace;
outside it, ``test_ray_group.py`` runs them all there (``unshare -n`` + ``ip link set lo
up``, which needs root: CI's ``make test`` runs as root; unprivileged runs skip with a
message). To run them by hand: ``sudo unshare -n sh -c 'ip link set lo up && pytest tests/ray_cluster'``.
"""

from __future__ import annotations

from testkit.ray_cluster import loopback_only

if loopback_only():
    collect_ignore = ["test_ray_group.py"]
else:
    collect_ignore_glob = ["test_cluster_*.py"]


# ---------------------------------------------------------------- fixtures (inside the namespace)

import contextlib  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from support.serve_process import serve_command, stop_process  # noqa: E402

NODE_MEMORY = 2 * 1024**3


class Nodes:
    """The session's 2-node cluster: node_a (head) and node_b, 1 CPU and 2 GiB each, a
    custom resource named after each node."""

    def __init__(self, base: Path) -> None:
        from testkit.ray_cluster import LocalCluster

        self.cluster = LocalCluster(base)
        self.cluster.add_node("node_a", num_cpus=1, memory=NODE_MEMORY)
        self.cluster.add_node("node_b", num_cpus=1, memory=NODE_MEMORY)
        self.cluster.wait_nodes(2)

    @property
    def address(self) -> str:
        return self.cluster.address

    @property
    def client_address(self) -> str:
        """``ray://127.0.0.1:PORT``: the head's Ray Client server."""
        return self.cluster.client_address

    def node(self, name: str):  # noqa: ANN201
        return next(n for n in self.cluster.nodes if n.name == name and n.alive())

    def kill(self, name: str) -> None:
        self.cluster.kill_node(self.node(name))

    def ensure_both(self) -> None:
        """After a test killed a node: start it again (a lost head on the same address
        and ports; node_b then joins the new head)."""
        started = False
        if self.cluster.head() is None:
            for n in self.cluster.nodes:
                if n.alive():  # a node of the old head: gone with it
                    self.cluster.kill_node(n)
            self.cluster.add_node("node_a", num_cpus=1, memory=NODE_MEMORY)
            started = True
        if "node_b" not in {n.name for n in self.cluster.nodes if n.alive()}:
            self.cluster.add_node("node_b", num_cpus=1, memory=NODE_MEMORY)
            started = True
        if started:
            self.cluster.wait_nodes(2)


TAG = "rayt-"  # every model id in these tests starts so: their workers can be found


def corral_workers(tag: str = TAG) -> list[int]:
    """Pids of the `corral.worker` processes whose settings hold ``tag`` (a model id)."""
    out = subprocess.run(["pgrep", "-f", f"corral.worker --fd .*{tag}"], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture(scope="session")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    pytest.importorskip("ray")
    from testkit.ray_cluster import loopback_only

    assert loopback_only(), "the Ray tests must run in a network namespace with only lo"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # the bridge gives up on a lost head after this (Ray's default: 60 s)
    os.environ["RAY_gcs_rpc_server_reconnect_timeout_s"] = "5"
    n = Nodes(tmp_path_factory.mktemp("cluster"))
    try:
        yield n
    finally:
        n.cluster.shutdown()
        with contextlib.suppress(Exception):
            for pid in corral_workers():
                os.kill(pid, 9)


@pytest.fixture
def cluster(nodes: Nodes) -> Nodes:
    nodes.ensure_both()
    return nodes


# ---------------------------------------------------------------- a real `corral serve --ray`

import asyncio  # noqa: E402
import json  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402


def toml(data: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {json.dumps(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    lines: list[str] = []
    for name, body in data.items():
        tables = body.items() if name == "models" else [(None, body)]
        for mid, t in tables:
            lines.append(f'[models."{mid}"]' if mid else f"[{name}]")
            lines += [f"{k} = {value(v)}" for k, v in t.items()]
    return "\n".join(lines) + "\n"


class RayRouter:
    """`corral serve -c FILE` with `ray_address` set, in its own session."""

    def __init__(self, tmp: Path, nodes: Nodes, models: dict[str, dict[str, Any]], **server: Any) -> None:
        from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL
        from testkit.ray_cluster import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        srv: dict[str, Any] = {"port": self.port, "include_default_model": False,
                               "log_dir": str(tmp / "logs"), "ray_address": nodes.address,
                               "ray_namespace": "corral-test", "restart_backoff_s": 0.2,
                               "load_timeout_s": 120.0}
        srv.update(server)
        cfg = tmp / "corral.toml"
        cfg.write_text(toml({"server": srv, "defaults": {"ctx_len": TEST_CTX_LEN, "n_parallel": TEST_N_PARALLEL}, "models": models}))
        self.log_path = tmp / "router.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(serve_command("-c", str(cfg)), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.client = httpx.AsyncClient(base_url=self.url, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    async def wait_up(self, timeout_s: float = 120) -> None:
        """Until /health answers (the router offers nothing else to wait on from outside)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            assert self.proc.poll() is None, f"corral serve exited:\n{self.log()}"
            try:
                if (await self.client.get("/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert asyncio.get_running_loop().time() < deadline, f"corral serve did not start:\n{self.log()}"
            await asyncio.sleep(0.2)

    async def model(self, mid: str) -> dict[str, Any]:
        r = await self.client.get("/models")
        return next(m for m in r.json()["data"] if m["id"] == mid)

    async def stop(self) -> None:
        await self.client.aclose()
        stop_process(self.proc, group=True)


class Events:
    """GET /models/events collected in the background; ``wait(pred)`` awaits one."""

    def __init__(self, router: RayRouter) -> None:
        self.seen: list[dict[str, Any]] = []
        self._new = asyncio.Event()
        self._task = asyncio.ensure_future(self._run(router.url))

    async def _run(self, url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=None) as c:
            async with c.stream("GET", "/models/events") as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        self.seen.append(json.loads(line[6:]))
                        self._new.set()

    async def wait(self, pred: Any, timeout_s: float = 120, since: int = 0) -> dict[str, Any]:
        async def find() -> dict[str, Any]:
            i = since
            while True:
                while i < len(self.seen):
                    if pred(self.seen[i]):
                        return self.seen[i]
                    i += 1
                self._new.clear()
                await self._new.wait()

        return await asyncio.wait_for(find(), timeout_s)

    def close(self) -> None:
        self._task.cancel()
