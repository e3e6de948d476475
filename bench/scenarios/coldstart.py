"""Scenario ``coldstart``: ``POST /models/load`` -> first streamed token, a fresh server each
time; corral vs llama.cpp's router mode."""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import httpx

from bench.clients.loadgen import completion_body, fmt
from bench.context import Ctx, llama_preset, llama_router_env, llama_router_supported, log, start
from bench.report import Table, ratio
from bench.servers import Server, ServerFailed, corral_cmd, free_port, llama_router_cmd


async def first_token_after_load(base_url: str, mid: str) -> tuple[float, float, float]:
    """POST /models/load, then a streamed request; returns (load call s, first token s, total s)
    all measured from just before the load call."""
    async with httpx.AsyncClient(timeout=300) as c:
        r = await c.get(base_url + "/models")  # both servers list {id, status: {value}} here
        if r.status_code == 200:
            for m in r.json().get("data", []):
                if m.get("id") == mid and (m.get("status") or {}).get("value") not in (None, "unloaded"):
                    raise ServerFailed(f"{mid} is '{m['status']['value']}' before the load call: not a cold start")
        t0 = time.perf_counter()
        r = await c.post(base_url + "/models/load", json={"model": mid})
        t_load = time.perf_counter() - t0
        if r.status_code >= 300:
            raise ServerFailed(f"POST /models/load -> HTTP {r.status_code}: {r.text[:200]}")
        body = completion_body(mid, 0, 8, stream=True)
        t_first = None
        async with c.stream("POST", base_url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                raise ServerFailed(f"completion -> HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
            async for line in resp.aiter_lines():
                if line.startswith("data:") and '"text"' in line and t_first is None:
                    obj = json.loads(line[5:])
                    if obj.get("choices") and obj["choices"][0].get("text"):
                        t_first = time.perf_counter() - t0
        total = time.perf_counter() - t0
        if t_first is None:
            raise ServerFailed("no token streamed")
        return t_load, t_first, total


async def sc_coldstart(ctx: Ctx) -> list[Table]:
    reps = ctx.n(3, 1)
    t = Table("Cold start: POST /models/load {model} -> first streamed token (fresh server each time)",
              ["server", "reps", "load call s (median)", "first token s (median)", "min s", "max s",
               "vs llama.cpp router"])
    res: dict[str, list[tuple[float, float, float]]] = {}
    errors: dict[str, str] = {}

    async def run_reps(name: str, make: Callable[[], Server], mid: str, llama: bool) -> None:
        for i in range(reps):
            srv = None
            try:
                srv = make()
                log(f"coldstart: {name} rep {i + 1}/{reps}")
                got = await first_token_after_load(srv.base_url, mid)
                res.setdefault(name, []).append(got)
            except Exception as e:  # noqa: BLE001
                errors[name] = str(e).splitlines()[0][:120]
                return
            finally:
                if srv:
                    srv.stop()

    if "corral" in ctx.args.servers:
        def mk_corral() -> Server:
            cfg = ctx.corral_config("coldstart", {"cold": ctx.corral_model(4, load_on_startup=False)})
            port = free_port()
            return start("corral-coldstart", corral_cmd(cfg, port), port)
        await run_reps("corral", mk_corral, "cold", False)

    if "llama-server" in ctx.args.servers:
        def mk_llama() -> Server:
            binary = ctx.need_llama()
            if not llama_router_supported(binary):
                raise ServerFailed("this llama-server has no router mode (--models-preset)")
            preset = ctx.tmp / "coldstart.ini"
            preset.write_text(llama_preset(ctx, {"cold": 4}, load_on_startup=False))
            port = free_port()
            return start("llama-router-coldstart", llama_router_cmd(binary, preset, port), port,
                         env=llama_router_env(ctx))
        await run_reps("llama.cpp router mode", mk_llama, "cold", True)

    ref = res.get("llama.cpp router mode")
    ref_med = statistics.median(x[1] for x in ref) if ref else None
    for name, vals in res.items():
        firsts = [x[1] for x in vals]
        med = statistics.median(firsts)
        t.rows.append([name, str(len(vals)), fmt(statistics.median(x[0] for x in vals), 3), fmt(med, 3),
                       fmt(min(firsts), 3), fmt(max(firsts), 3),
                       ratio(med, ref_med) if name != "llama.cpp router mode" else "1.00x"])
    for name, e in errors.items():
        t.rows.append([name, "FAILED", "–", "–", "–", "–", e.replace("|", "/")])
    t.notes.append("lower is better; ratio = corral time / llama.cpp router time. "
                   "'load call' is how long POST /models/load itself took to answer")
    t.data = {"results": res, "errors": errors}
    return [t]

