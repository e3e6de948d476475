"""Scenario ``overhead``: one corral worker reached directly over its socket
(bench/clients/wire_driver.py) vs through the HTTP router, the same worker settings."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from corral import wire

from bench.clients.lean_client import LeanLatency, run_load_lean
from bench.clients.loadgen import LoadResult, fmt, pct, run_load, summarize
from bench.clients.wire_driver import DirectWorker
from bench.context import SLOT_CTX, TURN_GAP_S, Ctx, log, start, warmup
from bench.report import Table, ratio
from bench.servers import corral_cmd, free_port, proc_cpu_s, tree_cpu_s


async def sc_overhead(ctx: Ctx) -> list[Table]:
    rounds = ctx.n(3, 2)
    n_lat = ctx.n(60, 20)  # pairs per round
    n_load = ctx.n(16, 8)  # per round
    settings = wire.WorkerSettings(model_id="bench", model_path=ctx.model, n_parallel=8,
                                   ctx_len=8 * SLOT_CTX, threads=ctx.threads, threads_batch=ctx.threads)
    t = Table("Router overhead: the same worker settings, direct over the socket vs through the HTTP router",
              ["path", "1-token latency p50 ms", "p95 ms", "c=8 tok/s", "c=8 TTFT p50 ms", "errors"])
    lat: dict[str, list[float]] = {"direct": [], "http": [], "httpx": []}
    pairs: list[float] = []  # router ms - direct ms of neighbouring 1-token requests
    raw: dict[str, list] = {"direct": [], "http": [], "httpx": []}
    wall = {"direct": 0.0, "http": 0.0, "httpx": 0.0}
    health_rtt: list[float] = []
    cpu = {"client_direct": 0.0, "client_http": 0.0, "client_httpx": 0.0, "router": 0.0, "worker_direct": 0.0,
           "worker_http": 0.0}
    w = DirectWorker(settings)
    srv = None
    try:
        secs = await w.start()
        log(f"direct worker ready after {secs:.1f}s")
        await w.run_load(label="warmup", concurrency=2, n_requests=2, max_tokens=8, first_index=900_000)
        port = free_port()
        cfg = ctx.corral_config("overhead", {"bench": ctx.corral_model(8)})
        srv = start("corral-overhead", corral_cmd(cfg, port), port)
        await warmup(srv.base_url, "bench")
        async with httpx.AsyncClient(timeout=10) as hc:
            for _ in range(20):
                t0 = time.perf_counter()
                await hc.get(srv.base_url + "/health")
                health_rtt.append((time.perf_counter() - t0) * 1000)
        # interleaved rounds: background load drifts alike for both paths
        for rnd in range(rounds):
            log(f"overhead round {rnd + 1}/{rounds}")
            await asyncio.sleep(TURN_GAP_S)
            # 1-token requests, direct and through the router one after the other (the
            # order alternating), a short distinct prompt each: pairs see the same moment
            async with LeanLatency(srv.base_url, "bench") as lean:
                for k in range(n_lat):
                    prompt = f"Note {rnd * 1000 + k}:"
                    if k % 2:
                        d = await w.one_latency(prompt)
                        h = await lean.one(prompt)
                    else:
                        h = await lean.one(prompt)
                        d = await w.one_latency(prompt)
                    lat["direct"].append(d)
                    lat["http"].append(h)
                    pairs.append(h - d)
            c0, w0 = time.process_time(), proc_cpu_s(w.proc.pid) or 0.0
            await asyncio.sleep(TURN_GAP_S)
            r = await w.run_load(label="direct", concurrency=8, n_requests=n_load, first_index=rnd * 1000)
            cpu["client_direct"] += time.process_time() - c0
            cpu["worker_direct"] += (proc_cpu_s(w.proc.pid) or 0.0) - w0
            raw["direct"] += r_raw(r, w)
            wall["direct"] += r.wall_s
            hr: list = []
            c0, r0, t0 = time.process_time(), proc_cpu_s(srv.pid) or 0.0, tree_cpu_s(srv.pid)
            await asyncio.sleep(TURN_GAP_S)
            r2 = await run_load_lean(srv.base_url, label="http", model="bench", concurrency=8, n_requests=n_load,
                                     raw=hr, first_index=rnd * 1000)
            cpu["client_http"] += time.process_time() - c0
            router_used = (proc_cpu_s(srv.pid) or 0.0) - r0
            cpu["router"] += router_used
            cpu["worker_http"] += tree_cpu_s(srv.pid) - t0 - router_used
            raw["http"] += hr
            wall["http"] += r2.wall_s
            hx: list = []
            c0 = time.process_time()
            await asyncio.sleep(TURN_GAP_S)
            r3 = await run_load(srv.base_url, label="httpx", model="bench", concurrency=8, n_requests=n_load,
                                raw=hx, first_index=rnd * 1000 + 500)
            cpu["client_httpx"] += time.process_time() - c0
            raw["httpx"] += hx
            wall["httpx"] += r3.wall_s
            log(f"  direct {r.tok_s:.1f} tok/s, http {r2.tok_s:.1f} tok/s, http with httpx {r3.tok_s:.1f} tok/s")
    except Exception as e:  # noqa: BLE001
        t.notes.append(f"FAILED: {str(e).splitlines()[0][:200]}")
    finally:
        await w.stop()
        if srv:
            srv.stop()
    loads = {k: summarize(k, 8, raw[k], wall[k]) for k in raw if raw[k]}
    labels = {"direct": "worker direct (corral.wire)", "http": "corral HTTP router (lean client)",
              "httpx": "corral HTTP router (httpx client)"}
    for k in ("direct", "http", "httpx"):
        L, r = lat[k], loads.get(k)
        if not L and r is None:
            continue
        t.rows.append([labels[k], fmt(statistics.median(L), 2) if L else "–", fmt(_p95(L), 2) if L else "–",
                       fmt(r.tok_s) if r else "–", fmt(r.ttft_p50_ms, 0) if r else "–",
                       str(r.errors) if r else "–"])
    if lat["direct"] and lat["http"]:
        added = statistics.median(lat["http"]) - statistics.median(lat["direct"])
        t.notes.append(f"added latency (1-token request, {len(pairs)} pairs of neighbouring requests, direct and "
                       f"through the router, order alternating): median of the pairs' differences "
                       f"{statistics.median(pairs):.2f} ms (goal <= 1 ms); difference of the medians {added:.2f} ms; "
                       "measured with a minimal HTTP/1.1 client (bench/clients/lean_client.py) so that both paths "
                       "have clients of about the same cost (httpx spends about half a millisecond of its own "
                       f"per request: GET /health round trip with httpx p50 {statistics.median(health_rtt):.2f} ms)")
    if "direct" in loads and "http" in loads:
        t.notes.append(f"streaming tok/s at c=8, router/direct: {ratio(loads['http'].tok_s, loads['direct'].tok_s)}"
                       " (goal >= 0.97x), both with clients of about the same cost (bench/clients/lean_client.py; the "
                       "direct client decodes msgspec frames, the lean HTTP client one msgspec JSON per SSE event)"
                       + (f"; with httpx as the client: {ratio(loads['httpx'].tok_s, loads['direct'].tok_s)}"
                          if "httpx" in loads else ""))
    if loads:
        t.notes.append("CPU seconds during the c=8 runs: "
                       f"direct: client {cpu['client_direct']:.1f}, worker {cpu['worker_direct']:.1f}; "
                       f"HTTP: client {cpu['client_http']:.1f}, router {cpu['router']:.1f}, "
                       f"worker {cpu['worker_http']:.1f}; httpx client {cpu['client_httpx']:.1f} "
                       "(the client shares the cores with the servers)")
    t.notes.append(f"{rounds} interleaved rounds; both paths up at once, one measured at a time, each turn after "
                   f"a {TURN_GAP_S} s pause")
    t.data = {"cpu_s": cpu, "direct_latency_ms": lat["direct"], "http_latency_ms": lat["http"],
              "health_rtt_ms": health_rtt, "loads": {k: v.as_dict() for k, v in loads.items()}}
    return [t]


def r_raw(r: LoadResult, w: Any) -> list:
    return w.last_raw


def _p95(v: list[float]) -> float | None:
    return pct(v, 95)

