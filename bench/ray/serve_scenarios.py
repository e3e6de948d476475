"""The Ray benchmark's main scenario (``compare``), run by ``python -m bench.ray.run``: every
setup up at once, measured in interleaved rounds, one table of ratios.

Setups (one model, threads 1, n_parallel 8, c=8, 64 streamed tokens per request):

- ``local``: ``corral serve`` (the local socketpair), its worker pinned to cpu 0
  (``taskset -a -p``), the router on cpu 1.
- ``ray 1``: ``corral serve --ray``, ``instances = 1`` on ``node_c`` (a 1-CPU node pinned
  to cpu 0), the router on cpu 1. Against ``local``: the Ray transport (goal >= 0.95x).
- ``ray 2``: ``corral serve --ray``, ``instances = 2`` on ``node_a`` (cpu 0) and
  ``node_b`` (cpu 1), 1 CPU each, the router on cpu 1. Against ``ray 1``: the scaling
  (goal >= 1.7x).
- ``limit 1`` / ``limit 2``: one 1-thread worker (cpu 0) at c=8 and two (cpu 0, cpu 1) at
  c=4 each, no Ray, no router: what two cores give at most (memory bandwidth is shared).

Idle setups take no CPU, so each round runs every setup one after the other (the order
reversed every other round, so a linear drift of the machine cancels out of each ratio);
a ratio is the median of its per-round ratios. Then ``POST /models/load`` to the first
token, locally and through Ray (the model unloaded before each, the two alternating).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from corral.store.embedded import embedded_model_path

from bench.clients.loadgen import LoadResult, run_load
from bench.ray.wire_scenarios import PinnedWorker, combined_two, load, log, settings, table
from bench.servers import PY, free_port

if TYPE_CHECKING:
    from bench.ray.context import Ctx

MODEL = {"threads": 1, "n_parallel": 8, "ctx_len": 8192}
ROUTER_CPUS = "1"  # every router on cpu 1; the single workers on cpu 0


class Router:
    """``corral serve`` with one model ``m``, pinned to ``cpus`` with taskset."""

    def __init__(self, ctx: "Ctx", name: str, model: dict[str, Any], ray: bool, cpus: str = ROUTER_CPUS) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = ctx.dir / f"{name}.toml"
        srv: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "include_default_model": False,
                               "log_dir": str(ctx.dir / f"{name}-logs")}
        if ray:
            srv["ray_address"] = ctx.cluster.address
            srv["ray_namespace"] = f"bench-{name}"
        m = {"path": str(embedded_model_path()), "load_on_startup": True, **model}
        cfg.write_text(_toml({"server": srv, "models": {"m": m}}))
        self.log = open(ctx.dir / f"{name}.log", "w")
        self.proc = subprocess.Popen(["taskset", "-c", cpus, PY, "-m", "corral.cli.main", "serve", "-c", str(cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    async def ready(self, timeout_s: float = 300) -> list[dict[str, Any]]:
        """Until model ``m`` is loaded with every instance ready; returns its instances."""
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=5) as c:
            while time.monotonic() < deadline:
                try:
                    r = await c.get(self.url + "/models")
                    if r.status_code == 200:
                        m = r.json()["data"][0]
                        insts = m.get("instances") or []
                        if insts and all(i["state"] == "ready" for i in insts):
                            return list(insts)
                except httpx.HTTPError:
                    pass
                if self.proc.poll() is not None:
                    raise RuntimeError(f"corral serve exited: see {self.log.name}")
                await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name}: corral serve not ready: see {self.log.name}")

    async def unload(self) -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(self.url + "/models/unload", json={"model": "m"})
            if r.status_code >= 300:
                raise RuntimeError(f"{self.name}: unload -> HTTP {r.status_code}: {r.text[:200]}")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(30)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
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


def pin(pid: int, cpus: str) -> None:
    """Every thread of ``pid`` onto ``cpus``."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, stdout=subprocess.DEVNULL)


def allowed_cpus(pid: int) -> str:
    """The CPUs every thread of ``pid`` may run on (``Cpus_allowed_list``), e.g. ``0``."""
    lists = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                lists.add(line.split(":", 1)[1].strip())
    return "/".join(sorted(lists))


async def http_load(r: Router, label: str, n: int, first: int) -> LoadResult:
    return await run_load(r.url, label=label, model="m", concurrency=8, n_requests=n, max_tokens=64,
                          first_index=first)


async def sc_compare(ctx: "Ctx") -> str:
    routers: list[Router] = []
    workers: list[PinnedWorker] = []
    try:
        log("starting the setups (3 routers, 3 plain workers)")
        local = Router(ctx, "local", MODEL, ray=False)
        ray1 = Router(ctx, "ray1", {**MODEL, "ray_resources": {"node_c": 1}}, ray=True)
        ray2 = Router(ctx, "ray2", {**MODEL, "instances": 2, "ray_resources": {"pair": 1}}, ray=True)
        routers += [local, ray1, ray2]
        (loc_inst,), _, r2_inst = await asyncio.gather(local.ready(), ray1.ready(), ray2.ready())
        pin(loc_inst["pid"], "0")  # the local worker on cpu 0, like ray 1's node
        if len({i["node"]["id"] for i in r2_inst}) != 2:
            raise RuntimeError(f"ray 2's instances are not on 2 nodes: {r2_inst}")
        r1_inst = await ray1.ready()
        ctx.pinned = {"local": allowed_cpus(loc_inst["pid"]), "ray 1": allowed_cpus(r1_inst[0]["pid"]),
                      "ray 2": "+".join(allowed_cpus(i["pid"]) for i in r2_inst),
                      "routers": allowed_cpus(local.proc.pid)}
        log(f"workers' CPUs: {ctx.pinned}")
        s = settings(threads=1)
        one, a, b = (PinnedWorker(s, "limit-one", "0"), PinnedWorker(s, "limit-a", "0"),
                     PinnedWorker(s, "limit-b", "1"))
        workers += [one, a, b]
        await asyncio.gather(one.start(), a.start(), b.start())

        async def run(name: str, n: int, first: int) -> LoadResult:
            if name == "limit 1":
                return await load(one, name, 8, n, first)
            if name == "limit 2":
                return await combined_two(a, b, name, n, first)
            r = {"local": local, "ray 1": ray1, "ray 2": ray2}[name]
            return await http_load(r, name, n, first)

        names = ["local", "ray 1", "ray 2", "limit 1", "limit 2"]
        log("warm-up")
        for name in names:
            await run(name, 8, 50_000)
        res: dict[str, list[LoadResult]] = {n: [] for n in names}
        for rnd in range(ctx.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for name in order:
                log(f"round {rnd + 1}/{ctx.rounds}: {name}")
                res[name].append(await run(name, ctx.n, rnd * 1000))
        cold = await _coldstart(ctx, local, ray1)
    finally:
        for r in routers:
            r.stop()
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
    return _report(ctx, res, cold)


async def _coldstart(ctx: "Ctx", local: Router, ray1: Router) -> dict[str, list[float]]:
    from bench.scenarios.coldstart import first_token_after_load

    out: dict[str, list[float]] = {"local": [], "ray 1": []}
    for rnd in range(ctx.cold_rounds):
        pair = [("local", local), ("ray 1", ray1)]
        for name, r in pair if rnd % 2 == 0 else pair[::-1]:
            log(f"cold start {rnd + 1}/{ctx.cold_rounds}: {name}")
            await r.unload()
            out[name].append((await first_token_after_load(r.url, "m"))[1])
    return out


def _ratios(num: list[LoadResult], den: list[LoadResult]) -> list[float]:
    return [x.tok_s / y.tok_s for x, y in zip(num, den) if y.tok_s > 0]


def _median(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def _report(ctx: "Ctx", res: dict[str, list[LoadResult]], cold: dict[str, list[float]]) -> str:
    scaling = _ratios(res["ray 2"], res["ray 1"])
    limit = _ratios(res["limit 2"], res["limit 1"])
    transport = _ratios(res["ray 1"], res["local"])
    cold_r = [x / y for x, y in zip(cold["ray 1"], cold["local"]) if y > 0]

    def each(v: list[float]) -> str:
        return ", ".join(f"{x:.2f}" for x in v)

    def tok(name: str) -> str:
        return "/".join(f"{r.tok_s:.1f}" for r in res[name])

    def ms(v: list[float]) -> str:
        return "/".join(f"{x * 1000:.0f}" for x in v)

    rows = [
        ["scaling: `ray 2` / `ray 1` (instances 2 on 2 nodes vs 1 on one node)", f"{_median(scaling):.2f}x",
         each(scaling), f"{tok('ray 2')} vs {tok('ray 1')}",
         f">= 1.7x; the limit (next row) {_median(limit):.2f}x, scaling / limit "
         f"{_median(scaling) / _median(limit):.2f}"],
        ["limit: 2 plain workers / 1 (cpu 0 + cpu 1 vs cpu 0; no Ray, no router)", f"{_median(limit):.2f}x",
         each(limit), f"{tok('limit 2')} vs {tok('limit 1')}", "what 2 cores give"],
        ["transport: `ray 1` / `local` (worker on cpu 0, router on cpu 1, both)", f"{_median(transport):.2f}x",
         each(transport), f"{tok('ray 1')} vs {tok('local')}", ">= 0.95x"],
        ["load to first token: Ray / local (ms)", f"{_median(cold_r):.2f}x", each(cold_r),
         f"{ms(cold['ray 1'])} vs {ms(cold['local'])}", "-"],
    ]
    cols = ["ratio", "median", "per round", "tok/s (or ms) per round", "goal / limit"]
    notes = [f"{ctx.rounds} interleaved rounds (order reversed every other round), c=8, {ctx.n} requests of "
             f"64 streamed tokens per setup and round; threads 1, n_parallel 8 per worker",
             "nodes (`ray start` under taskset, 1 CPU each): node_a cpu 0 + node_b cpu 1 (ray 2), node_c cpu 0 "
             "(ray 1); every router on cpu 1; the local worker pinned to cpu 0 with `taskset -a -p`",
             "CPUs the workers' threads may use (checked): " + ", ".join(
                 f"{k} {v}" for k, v in ctx.pinned.items()),
             "TTFT p50 ms (pooled): " + ", ".join(
                 f"{n} {_median([r.ttft_p50_ms for r in rs if r.ttft_p50_ms is not None]):.0f}"
                 for n, rs in res.items()),
             f"load to first token: {ctx.cold_rounds} rounds each, the model unloaded first; through Ray a new "
             "actor (a Ray worker process) starts on the node before the worker does"]
    return table("corral on Ray: scaling, the 2-core limit, transport, load to first token", cols, rows, notes)
