"""The latency the router adds to streamed requests at c=64, alone, and where it goes.

    .venv/bin/python -m bench.probes.router_latency                       # 5 rounds at c=64
    .venv/bin/python -m bench.probes.router_latency --base-src /tmp/base/src   # vs another tree's router
    .venv/bin/python -m bench.probes.router_latency --profile out.txt     # py-spy on the router

``router_ceiling``'s added-latency part (streamed requests of 8 to 16 tokens to a fast
worker stepping every 50 ms, bench/clients/fast_worker.py, reached directly over its socket
and through the router), in interleaved rounds: each round runs the direct worker, then each
router. ``--base-src`` starts a second router from another source tree (``PYTHONPATH``), so
a change is measured against its base on the same moments of the machine. Per round: added
TTFT and last-token p50/p95, the same split into the first ``c`` requests (they start
together: their first tokens share one step frame) and the rest (a few new ones a step), and
the router's CPU per request; then the medians. ``--burst``: the moments the first ``c`` got
their first token.
``--profile FILE``: ``py-spy record`` (raw folded stacks, on-CPU samples only, 1000 a second) on the first router during
its rounds (the venv needs py-spy: ``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import httpx

from corral import wire

from bench.clients.lean_client import run_load_lean
from bench.clients.loadgen import RequestResult, pct
from bench.clients.wire_driver import DirectWorker
from bench.context import Ctx, log, start
from bench.servers import PY, Server, corral_cmd, free_port, proc_cpu_s, stop_all

FAST = Path(__file__).resolve().parents[1] / "clients" / "fast_worker.py"
SLOTS = 256
STEP_S = 0.05
TOKENS = 16


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _split(direct: list[RequestResult], router: list[RequestResult], c: int, burst: bool) -> str:
    """Added TTFT p95 of the first ``c`` requests (started together: their first tokens
    come in one step frame) and of the rest (a few new ones a step)."""
    out = []
    for part in (slice(0, c), slice(c, None)):
        d = [x.ttft_s * 1000 for x in sorted(direct, key=lambda x: x.t0 or 0)[part] if x.ttft_s is not None]
        r = [x.ttft_s * 1000 for x in sorted(router, key=lambda x: x.t0 or 0)[part] if x.ttft_s is not None]
        out.append(f"{(pct(r, 50) or 0) - (pct(d, 50) or 0):+.2f}/{(pct(r, 95) or 0) - (pct(d, 95) or 0):+.2f}")
    text = f"added TTFT p50/p95 of the first {c} {out[0]}, of the rest {out[1]}"
    if burst:  # when the first c got their first token, ms after the first of them started
        for name, rs in (("direct", direct), ("router", router)):
            first = sorted(rs, key=lambda x: x.t0 or 0)[:c]
            base = min(x.t0 or 0 for x in first)
            got = sorted(round(((x.t0 or 0) + (x.ttft_s or 0) - base) * 1000, 1) for x in first)
            text += f"\n  {name} burst first tokens at ms: {got}"
    return text


async def main(args: argparse.Namespace) -> None:
    ctx = Ctx(argparse.Namespace(quick=False, model=None, threads=1))
    script = ctx.tmp / "fast-paced.json"
    script.write_text(json.dumps({"mode": "step", "step_s": STEP_S, "spread": TOKENS // 2}))
    models = {"paced": {"path": str(script), "n_parallel": SLOTS, "ctx_len": SLOTS * 1024}}
    cfg = ctx.corral_config("router-latency", models, worker_command=[PY, str(FAST)], max_queue=1024)
    routers: list[tuple[str, Server]] = []
    trees = [("this tree", None)] + ([("base", args.base_src)] if args.base_src else [])
    spy: subprocess.Popen[bytes] | None = None
    w = DirectWorker(wire.WorkerSettings(model_id="direct", model_path=str(script), n_parallel=SLOTS,
                                         ctx_len=SLOTS * 1024), name="fast-worker-direct",
                     worker_command=[PY, str(FAST)])
    try:
        for name, src in trees:
            port = free_port()
            env = dict(os.environ)
            if src:
                env["PYTHONPATH"] = str(Path(src).resolve())
            cmd = corral_cmd(cfg, port)
            if src:  # the other tree's corral, with this interpreter
                cmd = [PY, "-c", "from corral.cli.main import app; app()", *cmd[1:]]
            srv = start(f"corral-router-latency-{name.replace(' ', '-')}", cmd, port, env=env)
            routers.append((name, srv))
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as c:
                (await c.post("/models/load", json={"model": "paced"})).raise_for_status()
        await w.start()
        c = args.concurrency
        n = args.per_client * c
        # warm-up: every path once
        await w.run_load(label="direct", concurrency=c, n_requests=c, max_tokens=TOKENS)
        for _, srv in routers:
            await run_load_lean(srv.base_url, label="router", model="paced", concurrency=c, n_requests=c,
                                max_tokens=TOKENS)
        if args.profile:
            spy = subprocess.Popen([shutil.which("py-spy") or str(Path(PY).parent / "py-spy"), "record", "-f", "raw",
                                    "--nonblocking", "-r", "1000", "-o", args.profile, "--pid", str(routers[0][1].pid)],
                                   stdout=subprocess.DEVNULL)
            await asyncio.sleep(1.0)
        rows: dict[str, list[tuple[float, float, float, float, float]]] = {name: [] for name, _ in routers}
        for rnd in range(args.rounds):
            d = await w.run_load(label="direct", concurrency=c, n_requests=n, max_tokens=TOKENS)
            for name, srv in routers:
                assert srv.pid is not None
                cpu0 = proc_cpu_s(srv.pid) or 0.0
                raw: list[RequestResult] = []
                r = await run_load_lean(srv.base_url, label="router", model="paced", concurrency=c, n_requests=n,
                                        max_tokens=TOKENS, raw=raw)
                split = _split(w.last_raw, raw, c, args.burst)
                cpu = (proc_cpu_s(srv.pid) or 0.0) - cpu0
                row = ((r.ttft_p50_ms or 0) - (d.ttft_p50_ms or 0), (r.ttft_p95_ms or 0) - (d.ttft_p95_ms or 0),
                       (r.latency_p50_ms or 0) - (d.latency_p50_ms or 0),
                       (r.latency_p95_ms or 0) - (d.latency_p95_ms or 0), cpu / max(1, r.ok) * 1000)
                rows[name].append(row)
                log(f"round {rnd + 1} {name}: direct TTFT p50/p95 {d.ttft_p50_ms:.1f}/{d.ttft_p95_ms:.1f}, "
                    f"router {r.ttft_p50_ms:.1f}/{r.ttft_p95_ms:.1f}; added TTFT {row[0]:+.2f}/{row[1]:+.2f} ms, "
                    f"last {row[2]:+.2f}/{row[3]:+.2f} ms, router CPU {row[4]:.3f} ms/req, errors {r.errors}, "
                    f"load {_load()}; {split}")
        for name, got in rows.items():
            med = [statistics.median(x[k] for x in got) for k in range(5)]
            print(f"{name}: c={c}, {args.rounds} rounds of {n}: added TTFT p50 {med[0]:+.2f} p95 {med[1]:+.2f} ms, "
                  f"last token p50 {med[2]:+.2f} p95 {med[3]:+.2f} ms, router CPU {med[4]:.3f} ms a request "
                  f"(medians of the rounds)")
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        await w.stop()
        for _, srv in routers:
            srv.stop()
        stop_all()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.probes.router_latency")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--per-client", type=int, default=3, help="requests per client a round")
    ap.add_argument("--base-src", default=None, help="a second router from this source dir (PYTHONPATH)")
    ap.add_argument("--profile", default=None, help="py-spy record -f raw output of the first router")
    ap.add_argument("--burst", action="store_true", help="print when each of the first c requests got its first token")
    asyncio.run(main(ap.parse_args()))
