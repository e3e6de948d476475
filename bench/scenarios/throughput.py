"""Scenario ``throughput``: c=1, 8, 32 and 64 streaming (``--concurrency``), 64 tokens
(``--max-tokens``): llama-server with ``-np`` the largest c (``-kvu`` with ``--llama-kvu on``: off
by default, a unified cache made the same engine's step at 64 slots slower, bench/probes/kv_unified.py),
llama-cpp-python's server (up to c=8: it serves one request at a time, so above that it
only measures its queue) and corral with as many slots, all up at once, measured in
interleaved rounds. Before the rounds each server answers the same greedy prompt: the table
says whether corral's text is llama-server's (same GGUF, same backend: the same tokens).

Scenario ``default_slots`` (``sc_default_slots``): corral as a user who sets nothing gets it (``n_parallel = "auto"``,
32,768 tokens a slot) against today's former default of 4 slots, 64 clients at once: the
slots each got (and why) and the TTFT p95 of each.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx

from bench.clients.loadgen import LoadResult, run_load, summarize
from bench.context import SLOT_CTX, TURN_GAP_S, Ctx, idle_cpu_check, lcp_extra, log, start, warmup
from bench.report import LOAD_COLUMNS, Table, failed_row, load_row, ratio
from bench.servers import Server, corral_cmd, free_port, llama_cpp_python_cmd, llama_server_cmd


async def sc_throughput(ctx: Ctx) -> list[Table]:
    c_list = ctx.concurrency
    rounds = ctx.n(3, 2)
    # about 8 s per turn at c=1 as at c=8 (4 requests at c=1 made a turn 4 s long: +-10% per
    # round); from c=32 one request a client, so a round of llama-server at c=64 (4,096 tokens
    # at ~37 tok/s on 2 cores) stays under two minutes
    per_round = {c: max(ctx.n(8, 3), (ctx.n(2, 1) if c <= 8 else 1) * c) for c in c_list}
    n_slots = max(8, *c_list)
    kvu = getattr(ctx.args, "llama_kvu", "off") == "on"
    lcp_max_c = 8  # llama-cpp-python's server decodes one request at a time
    max_tokens = ctx.args.max_tokens
    gpu = f", {ctx.gpu_layers} layers on the GPU" if ctx.gpu_layers else ""
    t = Table(f"Throughput: /v1/completions, stream, {max_tokens} tokens, ignore_eos; "
              f"{ctx.threads} threads each{gpu}; llama-server -np {n_slots}{' -kvu' if kvu else ''}, "
              f"corral n_parallel = {n_slots}; ratio = tok/s vs llama-server at the same c", LOAD_COLUMNS)
    names = [n for n in ("llama-server", "llama-cpp-python", "corral") if n in ctx.args.servers]
    servers: dict[str, Server] = {}
    extras: dict[str, dict | None] = {"llama-server": None, "corral": None,
                                      "llama-cpp-python": lcp_extra(max_tokens)}
    models: dict[str, str | None] = {"llama-server": None, "llama-cpp-python": None, "corral": "bench"}
    failed: dict[str, str] = {}

    def make(name: str) -> Server:
        port = free_port()
        if name == "llama-server":
            return start(name, llama_server_cmd(ctx.need_llama(), ctx.model, port, n_parallel=n_slots,
                                                slot_ctx=SLOT_CTX, threads=ctx.threads,
                                                gpu_layers=ctx.gpu_layers, kv_unified=kvu), port)
        if name == "llama-cpp-python":
            ctx.need_lcp()
            # llama_cpp.server has no /health; /v1/models answers once the model is loaded
            return start(name, llama_cpp_python_cmd(ctx.model, port, threads=ctx.threads,
                                                    n_ctx=8 * SLOT_CTX), port, health_path="/v1/models")
        cfg = ctx.corral_config("throughput", {"bench": ctx.corral_model(n_slots)})
        return start(name, corral_cmd(cfg, port), port)

    raw: dict[tuple[str, int], list] = {}
    walls: dict[tuple[str, int], float] = {}
    per_round_tok_s: dict[tuple[str, int], list[float]] = {}
    # all servers up at once (idle ones use no CPU: checked below), measured in interleaved
    # rounds so that drifting background load hits every server alike
    try:
        for name in names:
            try:
                servers[name] = make(name)
                await warmup(servers[name].base_url, models[name], extras[name])
            except Exception as e:  # noqa: BLE001
                failed[name] = str(e)
                log(f"{name}: {e}")
                if name in servers:
                    servers.pop(name).stop()
        await idle_cpu_check(servers, t)
        await greedy_check(servers, models, max_tokens, t)
        for rnd in range(rounds):
            for c in c_list:
                for name in list(servers):
                    if name == "llama-cpp-python" and c > lcp_max_c:
                        continue
                    log(f"throughput round {rnd + 1}/{rounds}: {name} c={c} n={per_round[c]}")
                    await asyncio.sleep(TURN_GAP_S)
                    try:
                        r = await run_load(servers[name].base_url, label=name, model=models[name],
                                           concurrency=c, n_requests=per_round[c], max_tokens=max_tokens,
                                           extra=extras[name], raw=raw.setdefault((name, c), []),
                                           first_index=rnd * 1000 + c * 100)
                        walls[(name, c)] = walls.get((name, c), 0.0) + r.wall_s
                        per_round_tok_s.setdefault((name, c), []).append(r.tok_s)
                        log(f"  -> {r.tok_s:.1f} tok/s, errors {r.errors}")
                    except Exception as e:  # noqa: BLE001
                        failed[name] = f"failed during c={c}: {e}"
                        servers.pop(name).stop()
    finally:
        for s in servers.values():
            s.stop()

    results: dict[str, dict[int, LoadResult]] = {}
    for (name, c), rr in raw.items():
        if rr and name not in failed:
            results.setdefault(name, {})[c] = summarize(name, c, rr, walls[(name, c)])
    ref = results.get("llama-server", {})
    for c in c_list:
        for name in names:
            r = results.get(name, {}).get(c)
            if r is not None:
                t.rows.append(load_row(name, r, ref[c].tok_s if c in ref else None))
            elif name in failed:
                t.rows.append(failed_row(name, c, failed[name]))
    for name, why in failed.items():
        t.notes.append(f"{name} failed: {why.splitlines()[0][:200]}")
    t.data = {n: {c: r.as_dict() for c, r in d.items()} for n, d in results.items()}
    cr, lr = results.get("corral", {}), results.get("llama-server", {})
    for c, goal in ((1, "0.95x"), (8, "1.00x"), (32, "2.5x"), (64, "2.5x")):
        if c in cr and c in lr:
            t.notes.append(f"goal corral >= {goal} at c={c}: {ratio(cr[c].tok_s, lr[c].tok_s)}")
    if "llama-cpp-python" in names and any(c > lcp_max_c for c in c_list):
        t.notes.append(f"llama-cpp-python runs up to c={lcp_max_c}: its server decodes one request at a time")
    for c in c_list:
        ref_rounds = per_round_tok_s.get(("llama-server", c), [])
        for name in names:
            mine = per_round_tok_s.get((name, c), [])
            if name == "llama-server" or not ref_rounds or len(mine) != len(ref_rounds) or name in failed:
                continue
            rr = [a / b for a, b in zip(mine, ref_rounds) if b]
            if rr:
                t.notes.append(f"{name} vs llama-server at c={c}, round by round: "
                               + ", ".join(f"{x:.2f}x" for x in rr) + f" (median {statistics.median(rr):.2f}x)")
    t.notes.append(f"{rounds} interleaved rounds, each turn after a {TURN_GAP_S} s pause; tok/s = all tokens / "
                   "all wall time of that row's rounds")
    if "llama-cpp-python" in names:
        t.notes.append("llama-cpp-python's server has no ignore_eos; it gets min_tokens=max_tokens instead, "
                       "and --interrupt_requests False so concurrent requests queue instead of aborting")
    short = [f"{n} c={c} ({r.tokens_per_request:.1f})" for n, d in results.items() for c, r in d.items()
             if r.tokens_per_request is not None and r.tokens_per_request < max_tokens - 0.01]
    if short:
        t.notes.append("warning: fewer than max_tokens per request: " + ", ".join(short))
    return [t]


async def sc_default_slots(ctx: Ctx) -> list[Table]:
    """corral with no n_parallel and no ctx_len (the defaults: "auto" slots of 32,768 tokens)
    against n_parallel = 4 (the former default, 32,768 tokens a slot too), 64 clients at once,
    one after the other (never both up: "auto" reserves its slots' KV). The first request of
    each client is its TTFT under a full queue."""
    c = 64
    n = ctx.n(2, 1) * c
    max_tokens = ctx.args.max_tokens
    t = Table(f"Default slots: 64 clients at once, {n} streamed requests of {max_tokens} tokens; corral with "
              "n_parallel unset (\"auto\") vs n_parallel = 4, both 32,768 tokens a slot",
              ["n_parallel", "slots got", "why", "tok/s", "TTFT p50 ms", "TTFT p95 ms", "ITL p95 ms", "errors"])
    results: dict[str, LoadResult] = {}
    for label, extra in (("4", {"n_parallel": 4}), ("auto (unset)", {})):
        m = {"path": ctx.model, "threads": ctx.threads, **extra}
        if ctx.gpu_layers:
            m["n_gpu_layers"] = ctx.gpu_layers
        cfg = ctx.corral_config(f"default-slots-{len(results)}", {"bench": m})
        port = free_port()
        srv = start(f"corral-default-slots-{len(results)}", corral_cmd(cfg, port), port)
        try:
            await warmup(srv.base_url, "bench", None)
            async with httpx.AsyncClient(timeout=30) as client:
                entry = next(x for x in (await client.get(srv.base_url + "/models")).json()["data"]
                             if x["id"] == "bench")
            inst = entry["instances"][0]
            plan = inst["slots"].get("plan") or {}
            log(f"default slots {label}: {inst['slots']['total']} slots ({plan.get('reason')})")
            await asyncio.sleep(TURN_GAP_S)
            r = await run_load(srv.base_url, label=label, model="bench", concurrency=c, n_requests=n,
                               max_tokens=max_tokens)
            results[label] = r
            t.rows.append([label, str(inst["slots"]["total"]), str(plan.get("reason", "–")).replace("|", "/"),
                           f"{r.tok_s:.1f}", f"{r.ttft_p50_ms or 0:.0f}", f"{r.ttft_p95_ms or 0:.0f}",
                           f"{r.itl_p95_ms or 0:.0f}", str(r.errors)])
        except Exception as e:  # noqa: BLE001
            t.rows.append([label, "–", f"FAILED: {str(e).splitlines()[0][:120]}", "–", "–", "–", "–", "–"])
        finally:
            srv.stop()
    four, auto = results.get("4"), results.get("auto (unset)")
    if four and auto and four.ttft_p95_ms and auto.ttft_p95_ms:
        t.notes.append(f"goal TTFT p95 with auto >= 5x better than with 4 slots: "
                       f"{four.ttft_p95_ms / auto.ttft_p95_ms:.1f}x")
    return [t]


GREEDY_PROMPT = "The three most useful things to know about rivers are"


async def greedy_check(servers: dict[str, Server], models: dict[str, str | None], max_tokens: int, t: Table) -> None:
    """One greedy completion of ``GREEDY_PROMPT`` from each server; a note compares corral's
    text with llama-server's (``ignore_eos``, so both give ``max_tokens`` tokens)."""
    texts: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=900) as client:
        for name in ("llama-server", "corral"):
            if name not in servers:
                continue
            body = {"prompt": GREEDY_PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
            if models[name]:
                body["model"] = models[name]
            try:
                r = await client.post(servers[name].base_url + "/v1/completions", json=body)
                r.raise_for_status()
                texts[name] = r.json()["choices"][0]["text"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                t.notes.append(f"greedy check: {name} failed: {e}")
                return
    if len(texts) == 2:
        same = texts["corral"] == texts["llama-server"]
        t.notes.append(f"greedy {max_tokens} tokens of {GREEDY_PROMPT!r}: "
                       + ("the same text on corral and llama-server" if same else
                          f"DIFFERENT: corral {texts['corral']!r}, llama-server {texts['llama-server']!r}"))
