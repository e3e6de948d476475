"""Scenario ``variants``: a second id of the same file (its own system prompt), as a variant
of the loaded first id (one worker: control/plane.py's serving) against the same id with
``own_instances = true`` (a second worker), in one run: the memory the router reports
(``GET /models``, summed over the ids) and the workers' RSS (``/proc``), and the time from
``POST /models/load`` of the second id to its first streamed token (coldstart's measure)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import httpx

from bench.clients.loadgen import fmt
from bench.context import Ctx, log, start
from bench.report import Table, ratio
from bench.scenarios.coldstart import first_token_after_load
from bench.servers import Server, corral_cmd, free_port

SYSTEM = "You are a pirate. Answer every question like one, in one short sentence."
MiB = 1024 * 1024


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _memory(base_url: str) -> tuple[int, int, int]:
    """(router-reported bytes summed over the ids, the workers' RSS summed, workers)."""
    async with httpx.AsyncClient(timeout=60) as c:
        data: list[dict[str, Any]] = (await c.get(base_url + "/models")).json()["data"]
    pids = {i["pid"] for m in data for i in m.get("instances", []) if i.get("pid")}
    return sum(m.get("memory_bytes") or 0 for m in data), sum(_rss_bytes(p) for p in pids), len(pids)


async def _one(ctx: Ctx, own: bool) -> tuple[float, float, int, int, int]:
    """A fresh server: the first id loaded, then the second: (load call s, first token s,
    router bytes, RSS bytes, workers)."""
    second: dict[str, Any] = {"system": SYSTEM, **({"own_instances": True} if own else {})}
    cfg = ctx.corral_config("variants-own" if own else "variants", {
        "first": ctx.corral_model(4, load_on_startup=True), "second": ctx.corral_model(4, **second)})
    port = free_port()
    srv: Server | None = None
    try:
        srv = start("corral-variants", corral_cmd(cfg, port), port)
        async with httpx.AsyncClient(timeout=300) as c:
            r = await c.post(srv.base_url + "/models/load", json={"model": "first"})
            r.raise_for_status()
        t_load, t_first, _ = await first_token_after_load(srv.base_url, "second")
        routed, rss, workers = await _memory(srv.base_url)
        return t_load, t_first, routed, rss, workers
    finally:
        if srv:
            srv.stop()


async def sc_variants(ctx: Ctx) -> list[Table]:
    reps = ctx.n(3, 1)
    t = Table("Variants: a second id of the loaded file (its own system prompt), as a variant vs as a model of "
              "its own (own_instances = true): POST /models/load -> first token, memory with both ids loaded",
              ["second id", "reps", "load call s (median)", "first token s (median)", "router-reported MiB",
               "workers' RSS MiB", "workers", "first token vs own"])
    res: dict[str, list[tuple[float, float, int, int, int]]] = {}
    for name, own in (("variant", False), ("own_instances", True)):
        for i in range(reps):
            log(f"variants: {name} rep {i + 1}/{reps}")
            res.setdefault(name, []).append(await _one(ctx, own))
    own_first = statistics.median(x[1] for x in res["own_instances"])
    for name, vals in res.items():
        first = statistics.median(x[1] for x in vals)
        last = vals[-1]
        t.rows.append([name, str(len(vals)), fmt(statistics.median(x[0] for x in vals), 3), fmt(first, 3),
                       fmt(last[2] / MiB, 0), fmt(last[3] / MiB, 0), str(last[4]),
                       ratio(first, own_first) if name == "variant" else "1.00x"])
    t.notes.append("lower is better; memory with both ids loaded and answered once (the last rep); "
                   "router-reported: GET /models memory_bytes summed over the ids (a variant's is 0), RSS: /proc VmRSS "
                   "of every worker process")
    t.data = {"results": res}
    return [t]
