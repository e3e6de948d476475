"""Ray benchmarks (issue 12), on a local Ray cluster of 1-CPU nodes pinned with taskset.

    sudo .venv/bin/python -m bench.ray.run [--quick] [--rounds N] [--n N] [--only compare,relay]

Runs itself in a network namespace with only ``lo`` (``unshare -n``; needs root), because
Ray sends traffic beyond loopback on its own. Results: printed, and written to
``bench/results/ray-latest.md``.

- ``compare`` (the default): one table, every ratio measured in the same interleaved
  rounds with every setup up at once: instances 2 on 2 nodes against instances 1 on one
  node (scaling), two plain 1-thread workers against one (the 2-core limit), the Ray
  transport against the local socketpair through ``corral serve`` (worker on cpu 0 and
  router on cpu 1 in both), and ``POST /models/load`` to the first token through Ray
  against locally. See ``bench/ray/serve_scenarios.py``. Default: 4 rounds of 16 requests
  (about 7 minutes on 2 quiet cores); ``--quick``: 1 round of 8 (about 2 minutes).
- ``relay`` (only when asked): how the frames travel (the choice of the Ray transport):
  one worker at c=8 over its local socketpair, over a Ray actor's direct
  token-authenticated TCP connection (what corral uses), and relayed through the actor
  (method calls in, a streaming generator out).
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

from testkit.ray_cluster import LocalCluster, loopback_only
from bench.ray.context import Ctx
from bench.ray.serve_scenarios import sc_compare
from bench.ray.wire_scenarios import log, sc_relay
from bench.servers import LOGS, RESULTS, ROOT


# ---------------------------------------------------------------- main


SCENARIOS = {"compare": sc_compare, "relay": sc_relay}


async def amain(args: argparse.Namespace) -> int:
    import ray

    only = [s for o in (args.only or ["compare"]) for s in o.split(",")]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        print(f"bench.ray.run: unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="corral-ray-bench-"))
    cluster = LocalCluster(base / "cluster")
    out = [f"## corral on Ray ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"load average at start {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)", ""]
    try:
        # one node after the other (a node that registers late fails its start):
        # node_a + node_b take `instances = 2` (one each: resource `pair`), node_c `instances = 1`
        for i, (name, cpus, res) in enumerate([("node_a", "0", {"node_a": 1, "pair": 1}),
                                                ("node_b", "1", {"node_b": 1, "pair": 1}),
                                                ("node_c", "0", {"node_c": 1})]):
            cluster.add_node(name, num_cpus=1, cpus=cpus, resources=res)
            cluster.wait_nodes(i + 1)
        log(f"cluster up in {time.monotonic() - t_start:.0f} s")
        if "relay" in only:  # this process drives the relay's actors itself
            ray.init(address=cluster.address, namespace="bench", logging_level="ERROR", log_to_driver=False)
        ctx = Ctx(args, base, cluster)
        LOGS.mkdir(parents=True, exist_ok=True)
        for name in only:
            log(f"scenario {name}")
            try:
                out.append(await SCENARIOS[name](ctx))
            except Exception as exc:  # noqa: BLE001 - the other scenarios still run
                out.append(f"### {name}: FAILED: {exc}\n")
            print(out[-1], flush=True)
        out.append(f"- the whole run took {time.monotonic() - t_start:.0f} s")
        print(out[-1], flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ray-latest.md").write_text("\n".join(out))
    shutil.rmtree(base, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", action="append", help="compare (default), relay; comma-separated")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 4; --quick 1)")
    ap.add_argument("--n", type=int, help="requests per setup and round, c=8 (default 16; --quick 8)")
    args = ap.parse_args()
    if not loopback_only():
        if os.geteuid() != 0:
            print("bench.ray.run: needs root to run in a network namespace with only lo (Ray sends traffic "
                  "beyond loopback on its own)", file=sys.stderr)
            return 2
        return subprocess.call(["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                                sys.executable, "-m", "bench.ray.run", *sys.argv[1:]], cwd=ROOT)
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
