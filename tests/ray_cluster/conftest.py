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

from corral.cluster.local import loopback_only

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

NODE_MEMORY = 2 * 1024**3


class Nodes:
    """The session's 2-node cluster: node_a (head) and node_b, 1 CPU and 2 GiB each, a
    custom resource named after each node."""

    def __init__(self, base: Path) -> None:
        from corral.cluster.local import LocalCluster

        self.cluster = LocalCluster(base)
        self.cluster.add_node("node_a", num_cpus=1, memory=NODE_MEMORY)
        self.cluster.add_node("node_b", num_cpus=1, memory=NODE_MEMORY)
        self.cluster.wait_nodes(2)

    @property
    def address(self) -> str:
        return self.cluster.address

    def node(self, name: str):  # noqa: ANN201
        return next(n for n in self.cluster.nodes if n.name == name and n.alive())

    def kill(self, name: str) -> None:
        self.cluster.kill_node(self.node(name))

    def ensure_both(self) -> None:
        """After a test killed a node: start it again."""
        alive = {n.name for n in self.cluster.nodes if n.alive()}
        if "node_a" not in alive:
            raise RuntimeError("the head node is gone; the session's cluster cannot continue")
        if "node_b" not in alive:
            self.cluster.add_node("node_b", num_cpus=1, memory=NODE_MEMORY)
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
    from corral.cluster.local import loopback_only

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
