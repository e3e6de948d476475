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
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec  # noqa: E402

from corral import wire  # noqa: E402
from corral.cluster.local import LocalCluster, loopback_only  # noqa: E402
from corral.store.embedded import embedded_model_path  # noqa: E402
from loadgen import LoadResult, run_load  # noqa: E402
from servers import LOGS, PY, free_port  # noqa: E402
from wire_driver import DirectWorker, WorkerDied  # noqa: E402

import ray_relay  # noqa: E402


def log(msg: str) -> None:
    print(f"[ray-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table(title: str, cols: list[str], rows: list[list[str]], notes: list[str]) -> str:
    out = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out + [""] + [f"- {n}" for n in notes] + [""])


def settings(threads: int, n_parallel: int = 8, name: str = "bench") -> wire.WorkerSettings:
    return wire.WorkerSettings(model_id=name, model_path=str(embedded_model_path()), threads=threads,
                               n_parallel=n_parallel, ctx_len=1024 * n_parallel)


# ---------------------------------------------------------------- workers reached three ways


class PinnedWorker(DirectWorker):
    """A local worker on a socketpair, optionally pinned with taskset."""

    def __init__(self, s: wire.WorkerSettings, name: str, cpus: str | None) -> None:
        super().__init__(s, name)
        self.cpus = cpus

    async def start(self, timeout_s: float = 120.0) -> float:
        parent, child = socket.socketpair()
        self._log = open(self.log_path, "w")
        prefix = ["taskset", "-c", self.cpus] if self.cpus else []
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [*prefix, PY, "-m", "corral.worker", "--fd", str(child.fileno()),
             "--settings", msgspec.json.encode(self.settings).decode()],
            pass_fds=(child.fileno(),), stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)
        child.close()
        reader, writer = await asyncio.open_connection(sock=parent)
        return await self._attach(reader, writer, t0, timeout_s)

    async def _attach(self, reader: Any, writer: Any, t0: float, timeout_s: float) -> float:
        self._reader, self._writer = reader, writer
        self._ready_fut = asyncio.get_running_loop().create_future()
        self._pump = asyncio.create_task(self._read_loop())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready_fut), timeout_s)
        except asyncio.TimeoutError:
            raise WorkerDied(f"worker not ready after {timeout_s:.0f}s") from None
        return time.perf_counter() - t0


class RayTcpWorker(PinnedWorker):
    """corral's Ray transport: a WorkerHost actor, then TCP straight to the worker."""

    def __init__(self, s: wire.WorkerSettings, name: str, resources: dict[str, float]) -> None:
        super().__init__(s, name, None)
        self.resources = resources
        self.actor: Any = None

    async def start(self, timeout_s: float = 120.0) -> float:
        import ray

        from corral.cluster.host import WorkerHost

        self._log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.actor = ray.remote(WorkerHost).options(num_cpus=1, resources=self.resources).remote(
            self.name, msgspec.json.encode(self.settings).decode(), None)
        info = await self.actor.place.remote()
        reader, writer = await asyncio.open_connection(info["host"], info["port"])
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(info["token"])
        return await self._attach(reader, writer, t0, timeout_s)

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
        if self._pump is not None:
            self._pump.cancel()


class RayRelayWorker(PinnedWorker):
    """The alternative: frames relayed by the actor (calls in, a streaming generator out)."""

    def __init__(self, s: wire.WorkerSettings, name: str, resources: dict[str, float]) -> None:
        super().__init__(s, name, None)
        self.resources = resources
        self.actor: Any = None
        self._relay: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 120.0) -> float:
        import ray

        self._log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.actor = ray.remote(ray_relay.RelayHost).options(num_cpus=1, resources=self.resources).remote(
            msgspec.json.encode(self.settings).decode())
        reader = asyncio.StreamReader()
        gen = self.actor.frames.remote()

        async def pump() -> None:
            async for ref in gen:
                reader.feed_data(await ref)
            reader.feed_eof()

        self._relay = asyncio.create_task(pump())
        return await self._attach(reader, ray_relay.ActorWriter(self.actor), t0, timeout_s)

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
        for t in (self._pump, self._relay):
            if t is not None:
                t.cancel()


async def load(w: PinnedWorker, label: str, c: int, n: int, first: int) -> LoadResult:
    return await w.run_load(label=label, concurrency=c, n_requests=n, max_tokens=64, first_index=first)


def row(r: LoadResult, ref: float | None) -> list[str]:
    ratio = f"{r.tok_s / ref:.2f}x" if ref else "-"
    ttft = f"{r.ttft_p50_ms:.0f}" if r.ttft_p50_ms is not None else "-"
    return [r.label, str(r.concurrency), f"{r.ok}/{r.n_requests}", f"{r.tok_s:.1f}", ttft, ratio]


COLS = ["setup", "c", "ok", "tok/s", "TTFT p50 ms", "ratio"]


async def sc_relay(ctx: "Ctx") -> str:
    s = settings(threads=2)
    ways: list[PinnedWorker] = [PinnedWorker(s, "relay-socketpair", None),
                                RayTcpWorker(s, "relay-ray-tcp", {"node_a": 1}),
                                RayRelayWorker(s, "relay-ray-generator", {"node_a": 1})]
    rows, notes = [], []
    totals: dict[str, list[LoadResult]] = {w.name: [] for w in ways}
    for rnd in range(ctx.rounds):
        for w in ways:
            await w.start()
            await load(w, w.name, 8, 8, 10_000)  # warm-up
            totals[w.name].append(await load(w, w.name, 8, ctx.n, rnd * 1000))
            await w.stop()
    base = _merged(totals["relay-socketpair"])
    for w in ways:
        rows.append(row(_merged(totals[w.name]), base.tok_s))
    for w in ways:
        notes.append(f"{w.name}: per round " + ", ".join(f"{r.tok_s:.1f}" for r in totals[w.name]))
    notes.append("one worker, threads 2, n_parallel 8, 64 tokens per request; ratio against the socketpair")
    return table("Ray relay: how the frames travel (c=8)", COLS, rows, notes)


async def sc_limit(ctx: "Ctx") -> str:
    s = settings(threads=1)
    one = PinnedWorker(s, "limit-one-cpu0", "0")
    a, b = PinnedWorker(s, "limit-two-cpu0", "0"), PinnedWorker(s, "limit-two-cpu1", "1")
    ones, twos = [], []
    for rnd in range(ctx.rounds):
        await one.start()
        ones.append(await load(one, "1 worker, 1 thread, cpu 0", 8, ctx.n, rnd * 1000))
        await one.stop()
        await asyncio.gather(a.start(), b.start())
        t0 = time.perf_counter()
        ra, rb = await asyncio.gather(load(a, "a", 4, ctx.n // 2, rnd * 1000),
                                      load(b, "b", 4, ctx.n // 2, rnd * 1000 + 500))
        wall = time.perf_counter() - t0
        toks = ra.completion_tokens + rb.completion_tokens
        twos.append(LoadResult(label="2 workers, 1 thread each, cpu 0 + cpu 1", concurrency=8,
                               n_requests=ra.n_requests + rb.n_requests, ok=ra.ok + rb.ok,
                               completion_tokens=toks, wall_s=wall, tok_s=toks / wall,
                               ttft_p50_ms=ra.ttft_p50_ms))
        await asyncio.gather(a.stop(), b.stop())
    r1, r2 = _merged(ones), _merged(twos)
    ctx.limit = r2.tok_s / r1.tok_s if r1.tok_s else None
    notes = [f"per round: one {', '.join(f'{r.tok_s:.1f}' for r in ones)}; two "
             f"{', '.join(f'{r.tok_s:.1f}' for r in twos)}",
             "the limit for the scaling scenario: what two 1-thread llama.cpp processes reach next to one"]
    return table("The 2-core limit (no Ray, no router)", COLS, [row(r1, r1.tok_s), row(r2, r1.tok_s)], notes)


def _merged(rs: list[LoadResult]) -> LoadResult:
    toks = sum(r.completion_tokens for r in rs)
    wall = sum(r.wall_s for r in rs)
    ttfts = [r.ttft_p50_ms for r in rs if r.ttft_p50_ms is not None]
    return LoadResult(label=rs[0].label, concurrency=rs[0].concurrency,
                      n_requests=sum(r.n_requests for r in rs), ok=sum(r.ok for r in rs),
                      completion_tokens=toks, wall_s=wall, tok_s=toks / wall if wall else 0.0,
                      ttft_p50_ms=sorted(ttfts)[len(ttfts) // 2] if ttfts else None)


# ---------------------------------------------------------------- through corral serve


class Router:
    def __init__(self, ctx: "Ctx", name: str, model: dict[str, Any], ray: bool, load: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = ctx.dir / f"{name}.toml"
        srv: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "include_default_model": False,
                               "log_dir": str(ctx.dir / f"{name}-logs")}
        if ray:
            srv["ray_address"] = ctx.cluster.address
            srv["ray_namespace"] = f"bench-{name}"
        m = {"path": str(embedded_model_path()), "load_on_startup": load, **model}
        cfg.write_text(_toml({"server": srv, "models": {"m": m}}))
        self.log = open(ctx.dir / f"{name}.log", "w")
        self.proc = subprocess.Popen([PY, "-m", "corral.cli.main", "serve", "-c", str(cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    async def ready(self, loaded: bool = True, timeout_s: float = 180) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as c:
            while time.monotonic() < deadline:
                try:
                    r = await c.get(self.url + "/models")
                    if r.status_code == 200:
                        st = [m["status"]["value"] for m in r.json()["data"]]
                        if not loaded or st == ["loaded"]:
                            return
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"corral serve exited: see {self.log.name}")
                await asyncio.sleep(0.2)
        raise RuntimeError(f"corral serve not ready: see {self.log.name}")

    def stop(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _toml(d: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {json.dumps(x)}" for k, x in v.items()) + " }"
        return json.dumps(v)

    lines: list[str] = []
    for name, body in d.items():
        tables = body.items() if name == "models" else [(None, body)]
        for mid, t in tables:
            lines.append(f'[models."{mid}"]' if mid else f"[{name}]")
            lines += [f"{k} = {value(v)}" for k, v in t.items()]
    return "\n".join(lines) + "\n"


async def http_load(r: Router, label: str, c: int, n: int, first: int) -> LoadResult:
    return await run_load(r.url, label=label, model="m", concurrency=c, n_requests=n, max_tokens=64,
                          first_index=first)


async def sc_scaling(ctx: "Ctx") -> str:
    rows_raw: dict[str, list[LoadResult]] = {"1": [], "2": []}
    for rnd in range(ctx.rounds):
        for inst in ("1", "2"):
            r = Router(ctx, f"scaling-{inst}-{rnd}", {"instances": int(inst), "threads": 1, "n_parallel": 8,
                                                       "ctx_len": 8192}, ray=True)
            try:
                await r.ready()
                await http_load(r, "warm", 8, 8, 10_000)
                rows_raw[inst].append(await http_load(r, f"instances = {inst}", 8, ctx.n, rnd * 1000))
            finally:
                r.stop()
    one, two = _merged(rows_raw["1"]), _merged(rows_raw["2"])
    notes = [f"per round: instances=1 {', '.join(f'{x.tok_s:.1f}' for x in rows_raw['1'])}; "
             f"instances=2 {', '.join(f'{x.tok_s:.1f}' for x in rows_raw['2'])}",
             "node_a on cpu 0, node_b on cpu 1 (taskset), 1 CPU each; threads 1 per instance; "
             "instances spread over the nodes by Ray (SPREAD)",
             f"the limit (scenario `limit`, same run): {ctx.limit:.2f}x" if ctx.limit else
             "run `limit` in the same run for the limit"]
    return table("Scaling over 2 Ray nodes (corral serve --ray, c=8)", COLS,
                 [row(one, one.tok_s), row(two, one.tok_s)], notes)


async def sc_transport(ctx: "Ctx") -> str:
    model = {"instances": 1, "threads": 2, "n_parallel": 8, "ctx_len": 8192, "ray_resources": {"node_a": 1}}
    raw: dict[str, list[LoadResult]] = {"local": [], "ray": []}
    for rnd in range(ctx.rounds):
        for kind in ("local", "ray"):
            m = dict(model)
            if kind == "local":
                m.pop("ray_resources")
            r = Router(ctx, f"transport-{kind}-{rnd}", m, ray=kind == "ray")
            try:
                await r.ready()
                await http_load(r, "warm", 8, 8, 10_000)
                raw[kind].append(await http_load(r, f"corral serve ({kind})", 8, ctx.n, rnd * 1000))
            finally:
                r.stop()
    loc, ray_ = _merged(raw["local"]), _merged(raw["ray"])
    notes = [f"per round: local {', '.join(f'{x.tok_s:.1f}' for x in raw['local'])}; "
             f"ray {', '.join(f'{x.tok_s:.1f}' for x in raw['ray'])}",
             "threads 2 (cpus 0-1), n_parallel 8; the Ray worker pinned to node_a; goal >= 0.95x"]
    return table("Ray transport vs local socketpair (corral serve, c=8)", COLS,
                 [row(loc, loc.tok_s), row(ray_, loc.tok_s)], notes)


async def sc_coldstart(ctx: "Ctx") -> str:
    from run import first_token_after_load

    rows = []
    res: dict[str, list[tuple[float, float, float]]] = {"local": [], "ray": []}
    for rnd in range(ctx.rounds):
        for kind in ("local", "ray"):
            r = Router(ctx, f"cold-{kind}-{rnd}", {"threads": 1, "n_parallel": 2, "ctx_len": 1024},
                       ray=kind == "ray", load=False)
            try:
                await r.ready(loaded=False)
                res[kind].append(await first_token_after_load(r.url, "m"))
            finally:
                r.stop()
    for kind in ("local", "ray"):
        v = sorted(res[kind], key=lambda x: x[1])[len(res[kind]) // 2]
        rows.append([f"corral serve ({kind})", f"{v[0] * 1000:.0f}", f"{v[1] * 1000:.0f}",
                     ", ".join(f"{x[1] * 1000:.0f}" for x in res[kind])])
    return table("POST /models/load to the first token", ["setup", "load call ms", "first token ms (median)",
                                                          "first token ms, each"], rows,
                 ["through Ray: a new actor (a Ray worker process) on the node, then the worker loads"])


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
