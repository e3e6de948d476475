"""Scenario ``router_ceiling``: what the HTTP router itself can carry, with workers that
cost nothing (bench/clients/fast_worker.py: every answer at once, no model).

One router, two models on fast workers of 256 slots: ``step`` sends one token a slot per
step, a step a write, as the real worker does; ``burst`` sends each answer whole as soon as
it is asked. Measured, each with the router's own CPU time (its process, not the workers'):

1. streamed tokens per router CPU-second, 64 clients (goal >= 50,000 with ``step``);
2. non-streamed 1-token requests per router CPU-second, 64 clients (goal >= 1,000);
3. the latency the router adds: the same streamed requests of 8 to 16 tokens (so that the
   clients come back at different steps, as with real answers) to a worker stepping every
   50 ms (``paced``: a model's pace, so that the load, not the router, sets the rate) reached directly over its socket (bench/clients/wire_driver.py) and through the
   router, at c=1, 64 and 256: time to the first token and to the last (goal: p95 added
   < 2 ms at c=64);
4. past saturation: an open loop at twice the peak rate of (2): the goodput (answers a
   second) against that peak (goal >= 90%), the 503s with Retry-After, and whether a
   request whose body never comes is refused at once (shed before the body is read);
5. the router's longest garbage-collector pause under (1) and (2) (``corral_gc_pause_max_seconds``
   on /metrics), with its ``gc.freeze()`` after start-up and with a router whose freeze is
   turned off (``NO_FREEZE``: the same command with ``gc.freeze`` made a no-op).

Clients are the lean HTTP/1.1 ones (bench/clients/lean_client.py), on the same cores.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import httpx

from corral import wire

from bench.clients.lean_client import open_loop_posts, run_load_lean, run_posts_lean
from bench.clients.loadgen import fmt, pct
from bench.clients.wire_driver import DirectWorker
from bench.context import Ctx, log, start
from bench.report import Table
from bench.servers import PY, Server, corral_cmd, free_port, proc_cpu_s

FAST = Path(__file__).resolve().parents[1] / "clients" / "fast_worker.py"
SLOTS = 256
PACED_STEP_S = 0.05  # the paced worker's step
PACED_TOKENS = 16
# the corral command with gc.freeze a no-op (argv[0] stays "corral" for its messages)
NO_FREEZE = "import gc, sys; gc.freeze = lambda: None; sys.argv[0] = 'corral'; from corral.cli.main import app; app()"


async def sc_router_ceiling(ctx: Ctx) -> list[Table]:
    scripts = {}
    for name, script in (("step", {"mode": "step"}), ("burst", {"mode": "burst"}),
                         ("paced", {"mode": "step", "step_s": PACED_STEP_S, "spread": PACED_TOKENS // 2})):
        scripts[name] = ctx.tmp / f"fast-{name}.json"
        scripts[name].write_text(json.dumps(script))
    models = {mode: {"path": str(p), "n_parallel": SLOTS, "ctx_len": SLOTS * 1024} for mode, p in scripts.items()}
    cfg = ctx.corral_config("router-ceiling", models, worker_command=[PY, str(FAST)], max_queue=1024)
    tables: list[Table] = []
    gc_table = Table("Router ceiling, garbage collection: the longest pause during the streamed and non-streamed "
                     "loads above, with and without gc.freeze() after start-up",
                     ["router", "longest GC pause ms", "collections", "non-streamed p95 ms", "streamed step tok/s"])
    for frozen in (True, False):
        port = free_port()
        cmd = corral_cmd(cfg, port)
        if not frozen:
            cmd = [PY, "-c", NO_FREEZE, *cmd[1:]] if cmd[0].endswith("corral") else cmd
        srv = start(f"corral-router-ceiling{'' if frozen else '-nofreeze'}", cmd, port)
        try:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as c:
                for mode in models:
                    (await c.post("/models/load", json={"model": mode})).raise_for_status()
            streamed, step_tok_s = await _streamed(ctx, srv)
            peak, plain, p95 = await _plain(ctx, srv)
            pause, collections = await _gc_pause(srv)
            gc_table.rows.append(["gc.freeze() after start-up" if frozen else "no freeze", pause, collections,
                                  fmt(p95, 1), fmt(step_tok_s, 0)])
            if frozen:
                tables += [streamed, plain, await _added_latency(ctx, srv), await _saturation(ctx, srv, peak)]
        finally:
            srv.stop()
    return [*tables, gc_table]


def _cpu(srv: Server) -> float:
    assert srv.pid is not None
    return proc_cpu_s(srv.pid) or 0.0


async def _streamed(ctx: Ctx, srv: Server) -> tuple[Table, float]:
    c, max_tokens = 64, ctx.n(512, 256)
    n = c * ctx.n(4, 2)
    t = Table(f"Router ceiling, streamed: {c} clients, {n} requests of {max_tokens} tokens, fast workers",
              ["worker", "tokens", "wall s", "tok/s", "router CPU s", "tok per router CPU-s", "goal", "errors"])
    step_tok_s = 0.0
    for mode in ("step", "burst"):
        cpu0 = _cpu(srv)
        r = await run_load_lean(srv.base_url, label=mode, model=mode, concurrency=c, n_requests=n,
                                max_tokens=max_tokens)
        cpu = _cpu(srv) - cpu0
        per_cpu = r.completion_tokens / cpu if cpu else 0.0
        log(f"router_ceiling streamed {mode}: {r.tok_s:.0f} tok/s, {per_cpu:.0f} tok per router CPU-s")
        if mode == "step":
            step_tok_s = r.tok_s
        t.rows.append([mode, str(r.completion_tokens), fmt(r.wall_s, 2), fmt(r.tok_s, 0), fmt(cpu, 2),
                       fmt(per_cpu, 0), ">= 50,000" if mode == "step" else "–", str(r.errors)])
    t.notes.append("step: one token a slot per step frame, as the real worker sends them; burst: each answer whole "
                   "at once (the router coalesces the tokens that arrive together into one SSE event)")
    return t, step_tok_s


async def _plain(ctx: Ctx, srv: Server) -> tuple[float, Table, float | None]:
    c, n = 64, ctx.n(4000, 1500)
    t = Table(f"Router ceiling, non-streamed: {c} clients, {n} 1-token /v1/completions, a fast worker",
              ["req/s", "router CPU s", "req per router CPU-s (goal >= 1,000)", "p50 ms", "p95 ms", "errors"])
    cpu0 = _cpu(srv)
    r = await run_posts_lean(srv.base_url, label="plain", model="step", concurrency=c, n_requests=n)
    cpu = _cpu(srv) - cpu0
    per_cpu = r.ok / cpu if cpu else 0.0
    log(f"router_ceiling non-streamed: {r.req_s:.0f} req/s, {per_cpu:.0f} per router CPU-s")
    t.rows.append([fmt(r.req_s, 0), fmt(cpu, 2), fmt(per_cpu, 0), fmt(r.latency_p50_ms, 1),
                   fmt(r.latency_p95_ms, 1), str(r.errors)])
    return r.req_s, t, r.latency_p95_ms


async def _added_latency(ctx: Ctx, srv: Server) -> Table:
    t = Table(f"Router ceiling, added latency: streamed requests of {PACED_TOKENS // 2}-{PACED_TOKENS} tokens, "
              f"a worker stepping every "
              f"{PACED_STEP_S * 1000:.0f} ms, direct over its socket vs through the router (lean client), closed loop",
              ["c", "requests", "TTFT direct p50/p95 ms", "TTFT router p50/p95 ms", "added TTFT p50/p95 ms",
               "last token direct p50/p95 ms", "last token router p50/p95 ms", "added p50/p95 ms"])
    settings = wire.WorkerSettings(model_id="direct", model_path=str(ctx.tmp / "fast-paced.json"), n_parallel=SLOTS,
                                   ctx_len=SLOTS * 1024)
    w = DirectWorker(settings, name="fast-worker-direct", worker_command=[PY, str(FAST)])
    await w.start()

    def pair(a: float | None, b: float | None) -> str:
        return f"{fmt(a, 1)} / {fmt(b, 1)}"

    try:
        for c in (1, 64, 256):
            n = max(ctx.n(40, 20), ctx.n(3, 2) * c)
            d = await w.run_load(label="direct", concurrency=c, n_requests=n, max_tokens=PACED_TOKENS)
            r = await run_load_lean(srv.base_url, label="router", model="paced", concurrency=c, n_requests=n,
                                    max_tokens=PACED_TOKENS)
            ttft = [(r.ttft_p50_ms or 0) - (d.ttft_p50_ms or 0), (r.ttft_p95_ms or 0) - (d.ttft_p95_ms or 0)]
            last = [(r.latency_p50_ms or 0) - (d.latency_p50_ms or 0), (r.latency_p95_ms or 0) - (d.latency_p95_ms or 0)]
            t.rows.append([str(c), str(n), pair(d.ttft_p50_ms, d.ttft_p95_ms), pair(r.ttft_p50_ms, r.ttft_p95_ms),
                           pair(*ttft), pair(d.latency_p50_ms, d.latency_p95_ms),
                           pair(r.latency_p50_ms, r.latency_p95_ms), pair(*last)])
            log(f"router_ceiling added latency c={c}: TTFT p50 {ttft[0]:.2f} p95 {ttft[1]:.2f} ms, "
                f"last token p50 {last[0]:.2f} p95 {last[1]:.2f} ms")
    finally:
        await w.stop()
    t.notes.append("goal: added p95 < 2 ms at c=64. The clients, the router and the worker share the same cores")
    return t


async def _saturation(ctx: Ctx, srv: Server, peak: float) -> Table:
    duration = ctx.n(8.0, 4.0)
    t = Table(f"Router ceiling, past saturation: open loop of 1-token requests for {duration:.0f} s at 1x, 2x and 4x "
              f"the closed-loop peak of 64 clients ({peak:.0f} req/s)",
              ["offered req/s", "goodput req/s", "vs peak", "router CPU share", "503 (with Retry-After)",
               "client errors", "p50 ms of 200s", "p95 ms of 200s"])
    unread = "not tried"
    for factor in (1.0, 2.0, 4.0):
        rate = peak * factor
        probe = asyncio.create_task(_body_never_sent(srv, delay_s=duration / 2)) if factor == 2.0 else None
        cpu0, t0 = _cpu(srv), time.perf_counter()
        res = await open_loop_posts(srv.base_url, model="step", rate_per_s=rate, duration_s=duration)
        share = (_cpu(srv) - cpu0) / (time.perf_counter() - t0)
        if probe is not None:
            unread = await probe
        ok = [x for x in res if x.ok]
        in_window = [x for x in ok if x.t0 is not None and x.t0 + x.latency_s - t0 <= duration]
        shed = [x for x in res if x.status == 503]
        with_retry = [x for x in shed if x.error and "Retry-After: None" not in x.error]
        other = len(res) - len(ok) - len(shed)
        good = len(in_window) / duration
        lats = [x.latency_s * 1000 for x in ok]
        t.rows.append([fmt(rate, 0), fmt(good, 0), f"{good / peak:.0%}" if peak else "–", f"{share:.0%}",
                       f"{len(shed)} ({len(with_retry)})", str(other), fmt(pct(lats, 50), 1), fmt(pct(lats, 95), 1)])
        log(f"router_ceiling {factor}x: goodput {good:.0f} req/s of offered {rate:.0f}, router CPU {share:.0%}, "
            f"{len(shed)} shed, {other} client errors")
        kinds = Counter((x.error or "?").split(":")[0] for x in res if not x.ok and x.status != 503)
        if kinds:
            t.notes.append(f"client errors at {factor:g}x: " + ", ".join(f"{k} ({n})" for k, n in kinds.most_common(3)))
    t.notes.append(f"a request whose body never came, sent mid-way through the 2x load: {unread}")
    t.notes.append("goodput: 200s answered within the offered window, a second; goal at 2x: >= 90% of the peak. "
                   "Router CPU share under 100%: the open-loop client (on the same cores) is the limit, not the router")
    return t


async def _body_never_sent(srv: Server, delay_s: float) -> str:
    """Headers of a POST with a Content-Length but no body: a server that sheds before it
    reads the body answers at once; one that reads first waits for the body."""
    await asyncio.sleep(delay_s)
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n")
        t0 = time.perf_counter()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        except TimeoutError:
            return "no answer within 5 s (the router waits for the body)"
        status = head.split(b" ", 2)[1].decode()
        retry = next((ln.split(b":", 1)[1].strip().decode() for ln in head.split(b"\r\n")
                      if ln.lower().startswith(b"retry-after:")), None)
        return f"HTTP {status} after {(time.perf_counter() - t0) * 1000:.1f} ms, Retry-After {retry}"
    finally:
        writer.close()


async def _gc_pause(srv: Server) -> tuple[str, str]:
    """The router's longest GC pause so far and its collections (its /metrics)."""
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(srv.base_url + "/metrics")).text
    pause, count = "not reported", "–"
    for line in text.splitlines():
        if line.startswith("corral_gc_pause_max_seconds"):
            pause = f"{float(line.split()[-1]) * 1000:.1f}"
        elif line.startswith("corral_gc_collections_total"):
            count = f"{float(line.split()[-1]):.0f}"
    return pause, count
