"""A Ray cluster of several nodes on this machine, on 127.0.0.1: for tests and benchmarks.

Each node is one ``ray start --block`` in its own session (so ``kill_node`` takes the
raylet, its agents and its Ray workers down together, like a machine that is lost),
optionally pinned to CPUs with ``taskset``. No dashboard, no usage stats, fast node
failure detection. Ray looks up its own address by connecting to 8.8.8.8:53; run this
in a network namespace that has only ``lo`` (``loopback_only()``) to keep every packet
on this machine: the tests do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LocalCluster", "LocalNode", "loopback_only", "free_port", "ray_cli"]

_FAST_FAILURE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # a node started on busy cores may take a while to register with the head (Ray: 30 s)
    "RAY_raylet_start_wait_time_s": "120",
}


def loopback_only() -> bool:
    """True when this process's network namespace has no interface but ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ray_cli() -> list[str]:
    exe = Path(sys.executable).with_name("ray")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ray")
    if found is None:
        raise RuntimeError("the `ray` command is not installed (pip install 'corral[ray]')")
    return [found]


@dataclass
class LocalNode:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    resources: dict[str, float] = field(default_factory=dict)
    head: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None


class LocalCluster:
    def __init__(self, base_dir: Path, *, port: int | None = None, client_port: int | None = None) -> None:
        self.base_dir = base_dir
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        # the head's Ray Client server (``ray://``; needs ``ray[client]``)
        self.client_port = client_port or free_port()
        self.client_address = f"ray://127.0.0.1:{self.client_port}"
        self.nodes: list[LocalNode] = []
        base_dir.mkdir(parents=True, exist_ok=True)

    def _start(self, name: str, args: list[str], cpus: str | None) -> LocalNode:
        log_path = self.base_dir / f"{name}.log"
        prefix = ["taskset", "-c", cpus] if cpus else []
        env = {**os.environ, **_FAST_FAILURE_ENV}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([*prefix, *ray_cli(), "start", "--block", *args],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, env=env)
        node = LocalNode(name, proc, log_path)
        self.nodes.append(node)
        return node

    def add_node(self, name: str, *, num_cpus: int = 1, memory: int | None = None,
                 resources: dict[str, float] | None = None, cpus: str | None = None,
                 object_store_memory: int = 100 * 1024 * 1024) -> LocalNode:
        """The first node added is the head, and so is a node added while no head is alive
        (a head restarted on the same address). ``resources`` defaults to ``{name: 1}``."""
        res = resources if resources is not None else {name: 1.0}
        args = ["--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(res)}", f"--object-store-memory={object_store_memory}",
                "--disable-usage-stats"]
        if memory is not None:
            args.append(f"--memory={memory}")
        if self.head() is None:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--ray-client-server-port={self.client_port}",
                     f"--temp-dir={self.base_dir / 'ray'}"]
            node = self._start(name, args, cpus)
            node.head = True
            self._wait_port(node)
        else:
            node = self._start(name, [f"--address={self.address}", *args], cpus)
        node.resources = res
        return node

    def head(self) -> LocalNode | None:
        """The live head node, if any."""
        return next((n for n in self.nodes if n.head and n.alive()), None)

    def _wait_port(self, node: LocalNode, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not node.alive():
                raise RuntimeError(f"ray head exited: see {node.log_path}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
                return
            time.sleep(0.1)
        raise RuntimeError(f"ray head did not open port {self.port}: see {node.log_path}")

    def wait_nodes(self, count: int, timeout_s: float = 90.0) -> None:
        """Until ``count`` nodes are alive in the cluster (asked by a separate driver)."""
        code = ("import ray,sys,time\n"
                f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
                f"d=time.monotonic()+{timeout_s}\n"
                f"while sum(n['Alive'] for n in ray.nodes()) != {count}:\n"
                "    if time.monotonic()>d: sys.exit(1)\n"
                "    time.sleep(0.2)\n")
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        rc = subprocess.run([sys.executable, "-c", code], env=env, timeout=timeout_s + 30,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        if rc != 0:
            raise RuntimeError(f"the cluster did not reach {count} live nodes; logs in {self.base_dir}")

    def kill_node(self, node: LocalNode) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        node.proc.wait()

    def shutdown(self) -> None:
        for node in reversed(self.nodes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait()
