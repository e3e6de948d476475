"""Ray benchmark scenarios through ``corral serve``: ``scaling`` (instances over 2 pinned
1-CPU nodes), ``transport`` (Ray vs the local socketpair) and ``coldstart`` (load to the
first token). Run by ``bench/ray_bench.py``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any

from corral.store.embedded import embedded_model_path
from loadgen import LoadResult, run_load
from ray_wire_scenarios import COLS, _merged, row, table
from servers import PY, free_port

if TYPE_CHECKING:
    from ray_bench import Ctx


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
    model = {"instances": 1, "threads": 1, "n_parallel": 8, "ctx_len": 8192, "ray_resources": {"node_a": 1}}
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
             "threads 1, n_parallel 8; the Ray worker on node_a (cpu 0, 1 CPU); goal >= 0.95x"]
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
