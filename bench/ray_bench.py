"""Ray benchmarks (issue 12), on a local Ray cluster of 1-CPU nodes pinned with taskset.

    sudo .venv/bin/python bench/ray_bench.py [--quick] [--only relay,limit,scaling,transport,coldstart]

Runs itself in a network namespace with only ``lo`` (``unshare -n``; needs root), because
Ray sends traffic beyond loopback on its own. Scenarios, each printed as a markdown table
(absolute numbers and ratios, measured in interleaved rounds):

- ``relay``: how the frames travel (the choice of the Ray transport). One worker at c=8
  reached over its local socketpair, over a Ray actor's direct token-authenticated TCP
  connection (what corral uses), and relayed through the actor (method calls in, a
  streaming generator out).
- ``limit``: what 2 cores can give: two 1-thread workers (pinned to cpu 0 and cpu 1)
  next to one, c=8 in all (aggregate). Memory bandwidth is shared.
- ``scaling``: ``corral serve --ray``, one model, ``instances = 2`` on 2 nodes (node_a on
  cpu 0, node_b on cpu 1, 1 CPU each) against ``instances = 1``, c=8.
- ``transport``: ``corral serve`` (local socketpair) against ``corral serve --ray`` (one
  node), same worker settings, c=8.
- ``coldstart``: ``POST /models/load`` to the first streamed token, through Ray and locally.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corral.cluster.local import LocalCluster, loopback_only  # noqa: E402
from ray_serve_scenarios import sc_coldstart, sc_scaling, sc_transport  # noqa: E402
from ray_wire_scenarios import log, sc_limit, sc_relay  # noqa: E402
from servers import LOGS  # noqa: E402


# ---------------------------------------------------------------- main


class Ctx:
    def __init__(self, args: argparse.Namespace, base: Path, cluster: LocalCluster) -> None:
        self.rounds = 1 if args.quick else 2
        self.n = 32 if args.quick else 64
        self.dir = base
        self.cluster = cluster
        self.limit: float | None = None


SCENARIOS = {"relay": sc_relay, "limit": sc_limit, "scaling": sc_scaling, "transport": sc_transport,
             "coldstart": sc_coldstart}


async def amain(args: argparse.Namespace) -> int:
    import ray

    only = [s for o in (args.only or ["relay,limit,scaling,transport,coldstart"]) for s in o.split(",")]
    base = Path(tempfile.mkdtemp(prefix="corral-ray-bench-"))
    cluster = LocalCluster(base / "cluster")
    cluster.add_node("node_a", num_cpus=1, cpus="0")
    cluster.add_node("node_b", num_cpus=1, cpus="1")
    cluster.wait_nodes(2)
    ray.init(address=cluster.address, namespace="bench", logging_level="ERROR", log_to_driver=False)
    ctx = Ctx(args, base, cluster)
    LOGS.mkdir(parents=True, exist_ok=True)
    out = [f"## corral on Ray ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)", ""]
    try:
        for name in only:
            log(f"scenario {name}")
            try:
                out.append(await SCENARIOS[name](ctx))
            except Exception as exc:  # noqa: BLE001 - the other scenarios still run
                out.append(f"### {name}: FAILED: {exc}\n")
            print(out[-1], flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / "ray-latest.md").write_text("\n".join(out))
    shutil.rmtree(base, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", action="append")
    args = ap.parse_args()
    if not loopback_only():
        if os.geteuid() != 0:
            print("ray_bench: needs root to run in a network namespace with only lo (Ray sends traffic "
                  "beyond loopback on its own)", file=sys.stderr)
            return 2
        return subprocess.call(["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                                sys.executable, *sys.argv])
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
