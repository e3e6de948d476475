"""corral benchmarks: corral vs llama.cpp's llama-server vs llama-cpp-python's server.

Everything runs in ONE invocation on the same machine, same model, same thread
count, same client code, and prints markdown tables with absolute numbers and
ratios. Results also go to ``bench/results/`` (gitignored).

    .venv/bin/python -m bench.run                     # all scenarios (< 15 min)
    .venv/bin/python -m bench.run --quick             # smaller counts (< 5 min)
    .venv/bin/python -m bench.run --only throughput   # or overhead, multimodel, coldstart, queue
    .venv/bin/python -m bench.run --only throughput --repeat 5   # the ratios of 5 runs side by side

Scenarios (see bench/README.md):
  throughput  c=1 and c=8 streaming, 64 tokens: llama-server -np 8, llama-cpp-python, corral
  overhead    one corral worker reached directly over its socket vs through the HTTP router
  multimodel  two model ids (4 slots each) at c=4 each at once vs one model (8 slots) at c=8; llama.cpp router too
  coldstart   POST /models/load -> first token; corral vs llama.cpp router mode
  queue       1000 concurrent requests, n_parallel 4, max_queue 2000: errors, router peak RSS
  instances   one model as 1 vs 2 instances (8 slots each), c=16 (corral only)
  dialects    c=8 streaming through /v1/chat/completions, Ollama, Anthropic, Responses (bench/scenarios/dialects.py)
  sampling    c=8 with a JSON schema and with top_logprobs 5 vs without, corral and llama-server (bench/scenarios/sampling.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx

from bench import llama_server
from bench.clients.lean_client import LeanLatency, run_load_lean
from bench.clients.loadgen import LoadResult, combined, fmt, in_turn, run_load
from bench.scenarios import dialects
from bench.scenarios import sampling as constrained
from bench.servers import (
    PY, RESULTS, ROOT, Server, ServerFailed, corral_cmd, free_port, llama_cpp_python_cmd,
    llama_router_cmd, llama_server_cmd, stop_all, tree_cpu_s, proc_cpu_s,
)

SCENARIOS = ("throughput", "overhead", "multimodel", "coldstart", "queue", "dialects", "instances", "sampling")
SLOT_CTX = 1024  # KV cells per parallel slot, the same for every server
# A pause before each server's turn in interleaved rounds, so that each turn starts on a
# machine that has been idle a moment, as it is for a server used alone. corral's thread
# governor adapts to other processes' load: right after the other server's turn it would
# start on the thread count it settled on while that server ran (until its first check);
# two idle windows of 0.25 s fit in the pause. llama-server does not adapt: no effect on it.
TURN_GAP_S = 0.6


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- tables


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        if self.rows:
            out.append("| " + " | ".join(self.columns) + " |")
            out.append("|" + "|".join("---" for _ in self.columns) + "|")
            for r in self.rows:
                out.append("| " + " | ".join(r) + " |")
        else:
            out.append("(no rows)")
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}x"


LOAD_COLUMNS = ["server", "c", "requests", "tok/s", "ratio", "TTFT p50 ms", "TTFT p95 ms",
                "latency p50 ms", "tok/req", "errors"]


def load_row(name: str, r: LoadResult, ref: float | None) -> list[str]:
    errs = str(r.errors) + (f" ({r.status_5xx}x 5xx)" if r.status_5xx else "")
    return [name, str(r.concurrency), str(r.n_requests), fmt(r.tok_s), ratio(r.tok_s, ref),
            fmt(r.ttft_p50_ms, 0), fmt(r.ttft_p95_ms, 0), fmt(r.latency_p50_ms, 0),
            fmt(r.tokens_per_request, 1), errs]


def failed_row(name: str, c: int | str, why: str, ncols: int = len(LOAD_COLUMNS)) -> list[str]:
    short = why.strip().splitlines()[0][:90] if why.strip() else "failed"
    row = [name, str(c), "–", "FAILED", "–"] + ["–"] * (ncols - 6) + [short.replace("|", "/")]
    return row[:ncols]


# --------------------------------------------------------------------------- context


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick: bool = args.quick
        self.model: str = args.model
        self.threads: int = args.threads
        self.gpu_layers: int = getattr(args, "gpu_layers", 0)
        self.concurrency: list[int] = [int(x) for x in str(getattr(args, "concurrency", "1,8")).split(",")
                                       if x.strip()]
        self.tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
        self.llama_bin: Path | None = None
        self.llama_bin_error: str | None = None
        self.corral_ok: bool = True
        self.corral_error: str | None = None
        self.lcp_error: str | None = None
        self.lcp_checked = False

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    # ---- corral config
    def corral_config(self, name: str, models: dict[str, dict[str, Any]], **server: Any) -> Path:
        srv = {
            "include_default_model": False,
            "models_dir": str(self.tmp / "empty-models"),
            "max_loaded_models": max(4, len(models)),
            "queue_timeout_s": 900.0,
            "log_dir": str(RESULTS / "logs" / f"{name}-workers"),
        }
        srv.update(server)
        shutil.rmtree(srv["log_dir"], ignore_errors=True)  # no stale worker logs from an earlier run
        (self.tmp / "empty-models").mkdir(exist_ok=True)
        lines = ["# generated by bench/run.py", "[server]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in srv.items()]
        for mid, m in models.items():
            lines += ["", f'[models."{mid}"]']
            lines += [f"{k} = {toml_value(v)}" for k, v in m.items()]
        text = "\n".join(lines) + "\n"
        path = self.tmp / f"{name}.toml"
        path.write_text(text)
        try:  # fail early, with corral's own message, if the schema moved
            from corral.config import load_config

            load_config(path)
        except ImportError:
            pass
        return path

    def corral_model(self, n_parallel: int, **extra: Any) -> dict[str, Any]:
        m = {"path": self.model, "n_parallel": n_parallel, "ctx_len": n_parallel * SLOT_CTX,
             "threads": self.threads, "n_gpu_layers": self.gpu_layers or None}
        m.update(extra)
        return {k: v for k, v in m.items() if v is not None}  # threads=None: corral picks

    def need_llama(self) -> Path:
        if self.llama_bin is None:
            raise ServerFailed(f"llama-server not available: {self.llama_bin_error}")
        return self.llama_bin

    def need_lcp(self) -> None:
        if not self.lcp_checked:
            self.lcp_checked = True
            self.lcp_error = ensure_llama_cpp_python_server()
        if self.lcp_error:
            raise ServerFailed(self.lcp_error)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def ensure_llama_cpp_python_server() -> str | None:
    """llama-cpp-python's server needs extras that corral itself never depends on."""
    probe = [PY, "-c", "import llama_cpp.server.app"]
    if subprocess.run(probe, capture_output=True).returncode == 0:
        return None
    log("installing sse-starlette starlette-context pydantic-settings for llama_cpp.server (bench only)")
    r = subprocess.run([PY, "-m", "pip", "install", "-q", "sse-starlette", "starlette-context",
                        "pydantic-settings"], capture_output=True, text=True)
    if r.returncode != 0:
        return "pip install of llama_cpp.server extras failed: " + r.stderr.strip()[-300:]
    r = subprocess.run(probe, capture_output=True, text=True)
    if r.returncode != 0:
        return "llama_cpp.server not importable: " + r.stderr.strip()[-300:]
    return None


async def warmup(base_url: str, model: str | None, extra: dict | None = None, n: int = 2) -> None:
    """Unmeasured requests: loads lazily-loaded models, warms caches."""
    r = await run_load(base_url, label="warmup", model=model, concurrency=min(n, 2), n_requests=n,
                       max_tokens=8, extra=extra, timeout_s=300, first_index=900_000)
    if r.errors:
        raise ServerFailed(f"warmup failed: {r.error_samples[:1]}")


def start(name: str, cmd: list[str], port: int, timeout_s: float = 180.0, **kw: Any) -> Server:
    s = Server(name, cmd, port, **kw).start()
    try:
        t = s.wait_healthy(timeout_s)
        log(f"{name} healthy after {t:.1f}s (pid {s.pid}, port {port})")
    except BaseException:
        s.stop()
        raise
    return s


def lcp_extra(max_tokens: int) -> dict[str, Any]:
    # llama-cpp-python's server has no ignore_eos; min_tokens=max_tokens has the same effect
    return {"min_tokens": max_tokens}


# --------------------------------------------------------------------------- scenario a


async def idle_cpu_check(servers: dict[str, Server], t: Table, secs: float = 2.0) -> None:
    """All servers stay up while one is measured, so an idle one must not burn CPU: check it."""
    before = {n: tree_cpu_s(s.pid) for n, s in servers.items() if s.pid}
    await asyncio.sleep(secs)
    for n, s in servers.items():
        if s.pid and n in before:
            used = (tree_cpu_s(s.pid) - before[n]) / secs
            if used > 0.05:
                t.notes.append(f"warning: {n} used {used * 100:.0f}% of a core while idle")


async def sc_throughput(ctx: Ctx) -> list[Table]:
    c_list = ctx.concurrency
    rounds = ctx.n(3, 2)
    # about 8 s per turn at c=1 as at c=8 (4 requests at c=1 made a turn 4 s long: +-10% per round)
    per_round = {c: max(ctx.n(8, 3), ctx.n(2, 1) * c) for c in c_list}
    n_slots = max(8, *c_list)
    max_tokens = 64
    gpu = f", {ctx.gpu_layers} layers on the GPU" if ctx.gpu_layers else ""
    t = Table(f"Throughput: /v1/completions, stream, {max_tokens} tokens, ignore_eos; "
              f"{ctx.threads} threads each{gpu}; ratio = tok/s vs llama-server at the same c", LOAD_COLUMNS)
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
                                                gpu_layers=ctx.gpu_layers), port)
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
        for rnd in range(rounds):
            for c in c_list:
                for name in list(servers):
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

    from bench.clients.loadgen import summarize

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
    if 8 in cr and 8 in lr:
        t.notes.append(f"goal corral >= 1.00x at c=8: {ratio(cr[8].tok_s, lr[8].tok_s)}")
    if 1 in cr and 1 in lr:
        t.notes.append(f"goal corral >= 0.95x at c=1: {ratio(cr[1].tok_s, lr[1].tok_s)}")
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


# --------------------------------------------------------------------------- scenario b


async def sc_overhead(ctx: Ctx) -> list[Table]:
    from corral import wire
    from bench.clients.loadgen import summarize
    from bench.clients.wire_driver import DirectWorker

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
    from bench.clients.loadgen import pct

    return pct(v, 95)


# --------------------------------------------------------------------------- scenario c


async def _set_loaded(base_url: str, load: tuple[str, ...], unload: tuple[str, ...]) -> None:
    """Unload then load by the llama.cpp-router routes (corral and llama-server both have them)."""
    async with httpx.AsyncClient(timeout=300) as c:
        for mid in unload:
            await c.post(base_url + "/models/unload", json={"model": mid})
        for mid in load:
            r = await c.post(base_url + "/models/load", json={"model": mid})
            if r.status_code >= 300:
                raise ServerFailed(f"POST /models/load {mid} -> HTTP {r.status_code}: {r.text[:200]}")


async def _one_vs_two(srv: Server, one_id: str, ids: tuple[str, str], n_each: int, n_one: int, t: Table,
                      rounds: int, soft_s: float = 60.0, hard_s: float = 90.0,
                      ) -> tuple[LoadResult, list[LoadResult], LoadResult, list[float]]:
    """The fair comparison (same total slots, same clients): one model with 8 slots at c=8,
    alone; then two models with 4 slots each at c=4 each, at once. All three are loaded
    (idle ones use no CPU: checked) and the two phases alternate for ``rounds`` rounds, so
    drift of the machine hits both alike. Returns the phases over all rounds and each
    round's ratio."""
    base_url = srv.base_url
    await _set_loaded(base_url, (one_id, *ids), ())
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
            models.update({mid: ctx.corral_model(4, threads=threads) for mid in ids})
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
            from bench.scenarios.multimodel_limit import measure

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


def llama_router_supported(binary: Path) -> bool:
    r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    return "--models-preset" in (r.stdout + r.stderr)


def llama_preset(ctx: Ctx, models: dict[str, int], *, load_on_startup: bool) -> str:
    """``models``: id -> n_parallel (its context is n_parallel * SLOT_CTX)."""
    lines = ["version = 1", "", "[*]", f"t = {ctx.threads}", f"tb = {ctx.threads}"]
    if ctx.gpu_layers:
        lines.append(f"ngl = {ctx.gpu_layers}")
    # llama-server's default warmup stays on
    for mid, n_parallel in models.items():
        lines += ["", f"[{mid}]", f"model = {ctx.model}", f"np = {n_parallel}", f"c = {n_parallel * SLOT_CTX}",
                  f"load-on-startup = {'true' if load_on_startup else 'false'}"]
    return "\n".join(lines) + "\n"


def llama_router_env(ctx: Ctx) -> dict[str, str]:
    # an empty cache dir so the router lists only the preset models
    cache = ctx.tmp / "llama-cache"
    cache.mkdir(exist_ok=True)
    return {"LLAMA_CACHE": str(cache), "HF_HOME": str(cache / "hf")}


# --------------------------------------------------------------------------- scenario d


async def first_token_after_load(base_url: str, mid: str) -> tuple[float, float, float]:
    """POST /models/load, then a streamed request; returns (load call s, first token s, total s)
    all measured from just before the load call."""
    from bench.clients.loadgen import completion_body

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


# --------------------------------------------------------------------------- scenario e


async def sc_queue(ctx: Ctx) -> list[Table]:
    n = ctx.n(1000, 200)
    max_tokens = 8
    t = Table(f"Queue: {n} concurrent requests (stream, {max_tokens} tokens) to one model, n_parallel 4",
              ["server", "requests", "ok", "errors", "5xx", "wall s", "req/s", "tok/s", "latency p50 ms",
               "latency max ms", "peak RSS MiB", "CPU s (main process)", "CPU s (all processes)"])
    data: dict[str, Any] = {}

    async def one(name: str, srv: Server, model: str | None, extra: dict | None = None,
                  n: int = n) -> None:
        await warmup(srv.base_url, model, extra)
        log(f"queue: {name} {n} concurrent")
        main0, all0 = proc_cpu_s(srv.pid) or 0.0, tree_cpu_s(srv.pid)
        r = await run_load(srv.base_url, label=name, model=model, concurrency=n, n_requests=n,
                           max_tokens=max_tokens, extra=extra, timeout_s=900)
        main_cpu, all_cpu = (proc_cpu_s(srv.pid) or 0.0) - main0, tree_cpu_s(srv.pid) - all0
        hwm = srv.vm_hwm_kb()
        t.rows.append([name, str(n), str(r.ok), str(r.errors), str(r.status_5xx), fmt(r.wall_s),
                       fmt(r.req_s), fmt(r.tok_s), fmt(r.latency_p50_ms, 0), fmt(r.latency_max_ms, 0),
                       fmt(hwm / 1024 if hwm else None), fmt(main_cpu), fmt(all_cpu)])
        if r.error_samples:
            t.notes.append(f"{name} errors, e.g.: {r.error_samples[0][:150]}")
        data[name] = {**r.as_dict(), "vm_hwm_kb": hwm, "cpu_main_s": main_cpu, "cpu_all_s": all_cpu}

    if "corral" in ctx.args.servers:
        port = free_port()
        srv = None
        try:
            cfg = ctx.corral_config("queue", {"bench": ctx.corral_model(4)}, max_queue=2000)
            srv = start("corral-queue", corral_cmd(cfg, port), port)
            await one("corral (router process)", srv, "bench")
        except Exception as e:  # noqa: BLE001
            t.rows.append(["corral", str(n), "FAILED"] + ["–"] * 9 + [str(e).splitlines()[0][:90]])
        finally:
            if srv:
                srv.stop()
    if "llama-server" in ctx.args.servers and not ctx.args.no_reference:
        port = free_port()
        srv = None
        try:
            cmd = llama_server_cmd(ctx.need_llama(), ctx.model, port, n_parallel=4, slot_ctx=SLOT_CTX,
                                   threads=ctx.threads)
            srv = start("llama-server-queue", cmd, port)
            # the reference runs 200 requests: llama-server takes minutes for 1000 on 2 cores
            await one("llama-server -np 4 (reference, 200 requests)", srv, None, n=min(n, 200))
        except Exception as e:  # noqa: BLE001
            t.rows.append(["llama-server", str(n), "FAILED"] + ["–"] * 9 + [str(e).splitlines()[0][:90]])
        finally:
            if srv:
                srv.stop()
    t.notes.append("peak RSS is VmHWM of the main process: for corral the router alone (the model lives in "
                   "its worker), for llama-server the one process with the model. CPU s over the run only")
    t.data = data
    return [t]


# --------------------------------------------------------------------------- main


# hang guards per scenario (seconds; x0.6 with --quick), far above normal run times
async def sc_instances(ctx: Ctx) -> list[Table]:
    """One model as one instance vs as two instances (each its own process, same device),
    8 slots each, 16 clients: what a second instance on the same GPU or cores adds."""
    c, n = 16, ctx.n(48, 32)
    t = Table("Instances: one model as 1 vs 2 instances (8 slots each), c=16, stream, 64 tokens",
              ["server", "instances", "requests", "tok/s", "vs 1 instance", "TTFT p50 ms", "latency p50 ms",
               "errors"])
    if "corral" not in ctx.args.servers:
        return []
    ids = {1: "one-instance", 2: "two-instances"}
    cfg = ctx.corral_config("instances", {mid: ctx.corral_model(8, instances=k) for k, mid in ids.items()},
                            max_loaded_models=1)
    port = free_port()
    srv = start("corral-instances", corral_cmd(cfg, port), port)
    base: float | None = None
    try:
        for k, mid in ids.items():
            await _set_loaded(srv.base_url, (mid,), tuple(m for m in ids.values() if m != mid))
            await warmup(srv.base_url, mid)
            r = await run_load(srv.base_url, label=mid, model=mid, concurrency=c, n_requests=n)
            base = base or r.tok_s
            t.rows.append(["corral", str(k), str(r.n_requests), fmt(r.tok_s), ratio(r.tok_s, base),
                           fmt(r.ttft_p50_ms, 0), fmt(r.latency_p50_ms, 0), str(r.errors)])
    finally:
        srv.stop()
    gpu = f"{ctx.gpu_layers} layers on the GPU" if ctx.gpu_layers else "CPU"
    t.notes.append(f"{gpu}, {ctx.threads} threads per instance")
    return [t]


LIMITS_S = {"instances": 300, "throughput": 480, "overhead": 240, "multimodel": 600, "coldstart": 180, "queue": 600,
            "dialects": 1200, "sampling": 600}

FUNCS = {"instances": sc_instances, "throughput": sc_throughput, "overhead": sc_overhead, "multimodel": sc_multimodel,
         "coldstart": sc_coldstart, "queue": sc_queue,
         "dialects": lambda ctx: dialects.sc_dialects(ctx, sys.modules[__name__]),
         "sampling": lambda ctx: constrained.sc_sampling(ctx, sys.modules[__name__])}


def environment(ctx: Ctx) -> list[str]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = "?"
    load = os.getloadavg()
    return [
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, corral git {rev}"
        + (" (--quick)" if ctx.quick else ""),
        f"- machine: {cpu}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}; "
        f"load average at start {load[0]:.2f}",
        f"- model: {ctx.model}",
        f"- llama-server: {ctx.llama_bin or 'unavailable (' + str(ctx.llama_bin_error) + ')'} "
        f"(llama.cpp vendored by llama-cpp-python {llama_server.LLAMA_CPP_PYTHON_VERSION})",
        f"- threads {ctx.threads} everywhere, {SLOT_CTX} KV cells per parallel slot, "
        "same client (bench/clients/loadgen.py), sampling temperature 0.8 top_p 0.95 top_k 40 min_p 0.05",
    ]


async def amain(args: argparse.Namespace) -> int:
    ctx = Ctx(args)
    if "llama-server" in args.servers:
        try:
            found = llama_server.find()
            if found is None and not args.no_build:
                log("building llama-server (first run only; several minutes)")
                found = await asyncio.to_thread(llama_server.build, args.jobs)
            ctx.llama_bin = found
            if found is None:
                ctx.llama_bin_error = "not built (run: .venv/bin/python -m bench.llama_server)"
        except Exception as e:  # noqa: BLE001
            ctx.llama_bin_error = f"build failed: {e}"
            log(ctx.llama_bin_error)

    header = ["# corral benchmark", ""] + environment(ctx) + [""]
    print("\n".join(header), flush=True)
    tables: list[Table] = []
    t_all = time.perf_counter()
    runs = [name for _ in range(args.repeat) for name in args.only]
    for k, name in enumerate(runs):
        log(f"=== scenario {name}" + (f" (run {k // len(args.only) + 1} of {args.repeat})" if args.repeat > 1 else ""))
        t0 = time.perf_counter()
        limit = LIMITS_S[name] * (0.6 if ctx.quick else 1.0)
        try:
            got = await asyncio.wait_for(FUNCS[name](ctx), timeout=limit)
        except asyncio.TimeoutError:
            log(f"scenario {name} exceeded its {limit:.0f}s limit; stopped")
            got = [Table(f"{name}: FAILED", ["error"], [[f"did not finish within {limit:.0f}s (a server hung "
                                                        "or the machine is very busy); see bench/results/logs/"]])]
        except Exception as e:  # noqa: BLE001 -- one scenario failing never stops the others
            traceback.print_exc()
            got = [Table(f"{name}: FAILED", ["error"], [[str(e).splitlines()[0][:200] if str(e) else
                                                        type(e).__name__]])]
        finally:
            stop_all()
        dt = time.perf_counter() - t0
        for tb in got:
            tb.notes.append(f"scenario '{name}' took {dt:.0f}s")
            print(tb.markdown(), flush=True)
        tables.extend(got)
    if args.repeat > 1:
        summary = repeat_summary(tables)
        if summary is not None:
            print(summary.markdown(), flush=True)
            tables.append(summary)
    total = time.perf_counter() - t_all
    footer = f"_total {total:.0f}s; command: {' '.join(sys.argv)}_"
    print(footer, flush=True)

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    md = "\n".join(header) + "\n" + "\n".join(tb.markdown() for tb in tables) + "\n" + footer + "\n"
    (RESULTS / f"bench-{stamp}.md").write_text(md)
    (RESULTS / "latest.md").write_text(md)
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(
        {"argv": sys.argv, "env": header, "tables": [
            {"title": tb.title, "columns": tb.columns, "rows": tb.rows, "notes": tb.notes, "data": tb.data}
            for tb in tables]}, indent=1, default=str))
    log(f"wrote {RESULTS / f'bench-{stamp}.md'} and .json")
    shutil.rmtree(ctx.tmp, ignore_errors=True)
    return 0


def repeat_summary(tables: list[Table]) -> Table | None:
    """With --repeat: each ratio cell (columns named 'vs ...' or 'ratio') of each table row,
    one column per run, so a goal can be checked in every run at a glance."""
    cells: dict[tuple[str, str, str], list[str]] = {}
    for tb in tables:
        ratio_cols = [i for i, c in enumerate(tb.columns) if c.startswith("vs ") or "ratio" in c]
        for row in tb.rows:
            for i in ratio_cols:
                if i < len(row):
                    key = (tb.title.split(":")[0][:60], " / ".join(row[:2]), tb.columns[i])
                    cells.setdefault(key, []).append(row[i])
    if not cells:
        return None
    n = max(len(v) for v in cells.values())
    return Table("Ratios in each run (--repeat)", ["table", "row", "column", *[f"run {i + 1}" for i in range(n)]],
                 [[*key, *vals] for key, vals in cells.items()])


def main() -> int:
    ap = argparse.ArgumentParser(description="corral vs llama-server vs llama-cpp-python, side by side")
    ap.add_argument("--only", action="append", default=None,
                    help=f"scenario(s) to run, comma-separated or repeated: {', '.join(SCENARIOS)}")
    ap.add_argument("--quick", action="store_true", help="smaller counts (< 5 minutes)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the scenarios N times and print each ratio of each run in one table")
    ap.add_argument("--servers", default="llama-server,llama-cpp-python,corral",
                    help="which servers to include (comma-separated)")
    ap.add_argument("--model", default=None, help="GGUF file (default: corral's embedded Gemma 3 270M)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every server (default 2)")
    ap.add_argument("--gpu-layers", type=int, default=0,
                    help="layers on the GPU for every server (llama-server -ngl, corral n_gpu_layers); 0: CPU")
    ap.add_argument("--concurrency", default="1,8",
                    help="throughput: comma-separated client counts (default 1,8); slots = max(8, largest)")
    ap.add_argument("--no-build", action="store_true", help="never build llama-server; skip its rows if absent")
    ap.add_argument("--no-reference", action="store_true", help="queue scenario: skip the llama-server row")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="build parallelism for llama-server")
    args = ap.parse_args()

    only: list[str] = []
    for item in args.only or list(SCENARIOS):
        for s in item.split(","):
            s = s.strip()
            if not s:
                continue
            if s not in SCENARIOS:
                ap.error(f"unknown scenario {s!r}; choose from {', '.join(SCENARIOS)}")
            only.append(s)
    args.only = only
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if args.model is None:
        from corral.store.embedded import embedded_model_path

        args.model = str(embedded_model_path())
    if not Path(args.model).exists():
        ap.error(f"model not found: {args.model}")

    # 1000 concurrent connections need more than the usual 1024 descriptors (client and server)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 16384) if hard != resource.RLIM_INFINITY else 16384
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the servers are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return asyncio.run(amain(args))
    except KeyboardInterrupt:
        log("interrupted; stopping servers")
        return 130
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
