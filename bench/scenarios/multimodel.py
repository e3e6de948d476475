"""Scenario ``multimodel``: two model ids (4 slots each) at c=4 each at once vs one model
(8 slots) at c=8, on corral and on llama.cpp's router mode; then what the cores allow with
no router (bench/scenarios/multimodel_limit.py) and the ceiling from one step's cost
(bench/probes/batch_cost.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from bench.clients.loadgen import LoadResult, combined, fmt, in_turn, run_load
from bench.context import (
    SLOT_CTX, TURN_GAP_S, Ctx, idle_cpu_check, llama_preset, llama_router_env, llama_router_supported, log,
    set_loaded, start, warmup,
)
from bench.report import Table, ratio
from bench.scenarios.multimodel_limit import measure
from bench.servers import ROOT, Server, ServerFailed, corral_cmd, free_port, llama_router_cmd


async def _one_vs_two(srv: Server, one_id: str, ids: tuple[str, str], n_each: int, n_one: int, t: Table,
                      rounds: int, soft_s: float = 60.0, hard_s: float = 90.0,
                      ) -> tuple[LoadResult, list[LoadResult], LoadResult, list[float]]:
    """The fair comparison (same total slots, same clients): one model with 8 slots at c=8,
    alone; then two models with 4 slots each at c=4 each, at once. All three are loaded
    (idle ones use no CPU: checked) and the two phases alternate for ``rounds`` rounds, so
    drift of the machine hits both alike. Returns the phases over all rounds and each
    round's ratio."""
    base_url = srv.base_url
    await set_loaded(base_url, (one_id, *ids), ())
    for mid in (one_id, *ids):
        await warmup(base_url, mid)
    await idle_cpu_check({srv.name: srv}, t)
    ones: list[LoadResult] = []
    parts_by: list[list[LoadResult]] = [[] for _ in ids]
    boths: list[LoadResult] = []
    for rnd in range(rounds):
        log(f"multimodel round {rnd + 1}/{rounds}: one model (8 slots) c=8 n={n_one}")
        await asyncio.sleep(TURN_GAP_S)
        ones.append(await run_load(base_url, label=one_id, model=one_id, concurrency=8, n_requests=n_one,
                                   first_index=rnd * 100_000, soft_deadline_s=soft_s, hard_deadline_s=hard_s))
        log(f"multimodel round {rnd + 1}/{rounds}: two models (4 slots each) c=4 each n={n_each} each")
        await asyncio.sleep(TURN_GAP_S)
        parts = list(await asyncio.gather(*(
            run_load(base_url, label=mid, model=mid, concurrency=4, n_requests=n_each,
                     first_index=rnd * 100_000 + (k + 1) * 10_000, soft_deadline_s=soft_s, hard_deadline_s=hard_s)
            for k, mid in enumerate(ids))))
        for k, p in enumerate(parts):
            parts_by[k].append(p)
        boths.append(combined("both", parts))  # all tokens of both over the wall time of the whole phase
    per_round = [b.tok_s / o.tok_s for o, b in zip(ones, boths) if o.tok_s]
    return (in_turn(one_id, ones), [in_turn(mid, ps) for mid, ps in zip(ids, parts_by)], in_turn("both", boths),
            per_round)


async def sc_multimodel(ctx: Ctx) -> list[Table]:
    one_id, ids = "gemma-one", ("gemma-a", "gemma-b")
    n_each = ctx.n(12, 8)
    n_one = ctx.n(24, 16)
    rounds = ctx.n(2, 1)
    # oversubscribed cores can make a server crawl (seen: 5 tok/s); bound each load's time
    soft, hard = ctx.n(45, 25), ctx.n(75, 40)
    t = Table("Two busy models vs one: two model ids (4 slots each) at c=4 each, at once, vs one model "
              "(8 slots) at c=8 alone; same .gguf, one server",
              ["server", "load", "requests", "tok/s", "vs one model c=8", "TTFT p50 ms (worst)",
               "latency p50 ms (worst)", "errors"])
    data: dict[str, Any] = {}

    def nreq(r: LoadResult) -> str:
        return str(r.n_requests) + (f" (+{r.cut} cut)" if r.cut else "")

    def rows(name: str, one: LoadResult, parts: list[LoadResult], both: LoadResult, per_round: list[float]) -> None:
        t.notes.append(f"{name}: both together / one model, round by round: "
                       + ", ".join(f"{x:.2f}x" for x in per_round))
        t.rows.append([name, "one model (8 slots), c=8", nreq(one), fmt(one.tok_s), "1.00x",
                       fmt(one.ttft_p50_ms, 0), fmt(one.latency_p50_ms, 0), str(one.errors)])
        for p in parts:
            t.rows.append([name, f"{p.label} (4 slots) c=4 (concurrently)", nreq(p), fmt(p.tok_s),
                           ratio(p.tok_s, one.tok_s), fmt(p.ttft_p50_ms, 0), fmt(p.latency_p50_ms, 0),
                           str(p.errors)])
        if both.cut or one.cut:
            t.notes.append(f"{name}: stopped at the time limit; requests still running were cut and "
                           "their streamed tokens counted")
        t.rows.append([name, "**both together**", nreq(both), f"**{fmt(both.tok_s)}**",
                       ratio(both.tok_s, one.tok_s), fmt(both.ttft_p50_ms, 0), fmt(both.latency_p50_ms, 0),
                       str(both.errors)])
        data[name] = {"one": one.as_dict(), "parts": [p.as_dict() for p in parts], "both": both.as_dict()}

    variants = [("corral", ctx.threads)]
    if not ctx.quick:
        variants.append(("corral, threads unset (corral's default)", None))
    for name, threads in variants if "corral" in ctx.args.servers else []:
        port = free_port()
        srv = None
        try:
            models = {one_id: ctx.corral_model(8, threads=threads)}
            models.update({mid: ctx.corral_model(4, threads=threads, own_instances=True) for mid in ids})  # two workers
            cfg = ctx.corral_config("multimodel", models, max_loaded_models=3)
            srv = start("corral-multimodel", corral_cmd(cfg, port), port)
            rows(name, *await _one_vs_two(srv, one_id, ids, n_each, n_one, t, rounds, soft_s=soft, hard_s=hard))
        except Exception as e:  # noqa: BLE001
            t.rows.append([name, "FAILED", "–", "–", "–", "–", "–", str(e).splitlines()[0][:90]])
        finally:
            if srv:
                srv.stop()

    if "llama-server" in ctx.args.servers:
        srv = None
        try:
            binary = ctx.need_llama()
            if not llama_router_supported(binary):
                raise ServerFailed("this llama-server has no router mode (--models-preset)")
            preset = ctx.tmp / "multimodel.ini"
            preset.write_text(llama_preset(ctx, {one_id: 8, ids[0]: 4, ids[1]: 4}, load_on_startup=False))
            port = free_port()
            srv = start("llama-router-multimodel", llama_router_cmd(binary, preset, port), port,
                        env=llama_router_env(ctx))
            rows("llama-server router mode", *await _one_vs_two(srv, one_id, ids, n_each, n_one, t, rounds,
                                                                soft_s=soft, hard_s=hard))
        except Exception as e:  # noqa: BLE001
            t.rows.append(["llama-server router mode", "FAILED", "–", "–", "–", "–", "–",
                           str(e).splitlines()[0][:90]])
        finally:
            if srv:
                srv.stop()
    limit = Table("What the cores allow for two busy models: workers reached directly (no router), the same "
                  "loads as above", ["workers", "tok/s", "vs one worker c=8", "rounds"])
    if "corral" in ctx.args.servers:
        try:
            lim = await measure(str(ctx.model), ctx.threads, SLOT_CTX, n_one, n_each, ctx.n(2, 1), log)
            ref = sum(r.completion_tokens for r in lim["one"]) / max(1e-9, sum(r.wall_s for r in lim["one"]))
            labels = {"one": f"one worker, {ctx.threads} threads, 8 slots, c=8",
                      "pinned": "two workers, 4 slots each, c=4 each, each pinned to half the cores "
                                "(one thread per core)",
                      "free": f"two workers, 4 slots each, c=4 each, {ctx.threads} threads each, not pinned "
                              "(governor)"}
            for k, rs in lim.items():
                tok_s = sum(r.completion_tokens for r in rs) / max(1e-9, sum(r.wall_s for r in rs))
                limit.rows.append([labels[k], fmt(tok_s), ratio(tok_s, ref),
                                   ", ".join(fmt(r.tok_s) for r in rs)])
            data["limit"] = {k: [r.as_dict() for r in rs] for k, rs in lim.items()}
        except Exception as e:  # noqa: BLE001
            limit.rows.append(["FAILED", "–", "–", str(e).splitlines()[0][:90]])
        limit.notes.append("the same client as the overhead scenario's direct path (bench/clients/wire_driver.py); "
                           "rounds interleaved, tok/s per round in the last column")
        try:  # the ceiling from one step's cost (bench/probes/batch_cost.py), in its own process
            out = subprocess.run([sys.executable, "-m", "bench.probes.batch_cost", "--json",
                                  "--model", str(ctx.model), "--threads", str(ctx.threads)],
                                 capture_output=True, text=True, timeout=600, check=True, cwd=ROOT)
            bc = json.loads(out.stdout.strip().splitlines()[-1])
            limit.rows.append([f"ceiling, side by side: step(batch 8, {bc['threads']} threads) / step(batch 4, "
                               f"{bc['half']} thread(s)) = {bc['b8_ms']:.1f} / {bc['b4_half_ms']:.1f} ms",
                               "–", f"{bc['split_ceiling']:.2f}x", "one process, nothing else running"])
            limit.rows.append([f"ceiling, taking turns: step(batch 8) / (2 x step(batch 4, {bc['threads']} "
                               f"threads)) = {bc['b8_ms']:.1f} / (2 x {bc['b4_all_ms']:.1f}) ms",
                               "–", f"{bc['turns_ceiling']:.2f}x", "one process, nothing else running"])
            data["ceiling"] = bc
        except Exception as e:  # noqa: BLE001
            limit.rows.append(["ceiling (bench/probes/batch_cost.py) FAILED", "–", "–", str(e).splitlines()[0][:90]])
    t.notes.append(f"{ctx.threads} threads per model (unless said otherwise), each model its own process; "
                   f"64 tokens, stream; all three models loaded (idle ones use no CPU), the one-model and the "
                   f"two-model phase alternate for {rounds} rounds, each after a {TURN_GAP_S} s pause; 'both "
                   "together' = all tokens of both over the wall time of the whole phase, summed over the "
                   "rounds; ratios are against the one-model row of the same server and config")
    t.data = data
    return [t, limit] if limit.rows else [t]
