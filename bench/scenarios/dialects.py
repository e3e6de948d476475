"""Scenario ``dialects``: streaming c=8 through each API corral answers, in one run.

One corral server, one model. The same closed-loop load (c clients, 64 tokens each with
``ignore_eos``, llama.cpp's default sampling, distinct prompts) goes through
/v1/chat/completions (the reference), Ollama's /api/chat, Anthropic's /v1/messages and
the Responses API's /v1/responses. Rounds are interleaved (every route once per round,
in turn) so drift of the machine hits all alike; the ratio is each route's tok/s over the
OpenAI route's in the same round, and the table shows the median round. A second table
runs all four mixed in one closed loop (request i through route i mod 4), so every route
sees the same moments of a busy machine, and compares the per-request streaming rate.
The router's CPU time per 1000 tokens per route is the translation's own cost. Each
dialect is a translation onto the same request path, so the ratios should be 1.00x
within noise.

    .venv/bin/python -m bench.run --only dialects
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import httpx

from bench.clients.loadgen import SAMPLING, LoadResult, RequestResult, fmt, make_prompt, summarize
from bench.context import Ctx, log, start
from bench.report import LOAD_COLUMNS, Table, load_row
from bench.servers import corral_cmd, free_port, proc_cpu_s

__all__ = ["ROUTES", "sc_dialects"]

MAX_TOKENS = 64


def _openai(model: str, prompt: str) -> tuple[str, dict[str, Any]]:
    return "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": prompt}],
                                    "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True,
                                    "stream_options": {"include_usage": True}, **SAMPLING}


def _ollama(model: str, prompt: str) -> tuple[str, dict[str, Any]]:
    return "/api/chat", {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                         "options": {"num_predict": MAX_TOKENS, "ignore_eos": True, **SAMPLING}}


def _anthropic(model: str, prompt: str) -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {"model": model, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True,
                            "temperature": 0.8, "top_p": 0.95, "top_k": 40}


def _responses(model: str, prompt: str) -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": model, "input": prompt, "max_output_tokens": MAX_TOKENS, "stream": True,
                             "ignore_eos": True, "temperature": 0.8, "top_p": 0.95}


def _text_and_tokens(route: str, obj: dict[str, Any]) -> tuple[bool, int | None]:
    """(this event carries text, completion tokens if it reports them)."""
    if route == "openai":
        usage = obj.get("usage")
        ch = obj.get("choices") or []
        text = bool(ch and (ch[0].get("delta") or {}).get("content"))
        return text, (usage or {}).get("completion_tokens") if usage else None
    if route == "ollama":
        if obj.get("done"):
            return False, obj.get("eval_count")
        return bool((obj.get("message") or {}).get("content")), None
    if route == "anthropic":
        if obj.get("type") == "message_delta":
            return False, obj["usage"]["output_tokens"]
        return obj.get("type") == "content_block_delta", None
    if obj.get("type") in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens
        return False, obj["response"]["usage"]["output_tokens"]
    return obj.get("type") == "response.output_text.delta", None


ROUTES: dict[str, Callable[[str, str], tuple[str, dict[str, Any]]]] = {
    "openai": _openai, "ollama": _ollama, "anthropic": _anthropic, "responses": _responses}


async def _one(client: httpx.AsyncClient, base: str, route: str, model: str, i: int) -> RequestResult:
    path, body = ROUTES[route](model, make_prompt(i))
    res = RequestResult(ok=False)
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", base + path, json=body) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return res
            async for line in resp.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else line.strip()
                if not data or data == "[DONE]" or line.startswith("event:"):
                    continue
                obj = json.loads(data)
                if "error" in obj and route in ("ollama", "openai") or obj.get("type") == "error":
                    res.error = f"stream error: {str(obj)[:200]}"
                    return res
                text, tokens = _text_and_tokens(route, obj)
                if text and res.ttft_s is None:
                    res.ttft_s = time.perf_counter() - t0
                if tokens is not None:
                    res.completion_tokens = int(tokens)
        res.ok = True
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        res.latency_s = time.perf_counter() - t0
    return res


async def run_route(base: str, route: str, model: str, concurrency: int, n_requests: int,
                    first_index: int) -> LoadResult:
    """Closed loop through one route, like loadgen.run_load."""
    counter = iter(range(first_index, first_index + n_requests))
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30), limits=limits) as client:
        async def worker() -> None:
            for i in counter:
                results.append(await _one(client, base, route, model, i))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return summarize(route, concurrency, results, wall)


async def run_mixed(base: str, model: str, concurrency: int, n_requests: int, first_index: int
                    ) -> dict[str, list[RequestResult]]:
    """Closed loop where request i goes through route i mod 4: every route sees the same
    moments of the machine, so background load cannot favour one of them."""
    names = list(ROUTES)
    counter = iter(range(first_index, first_index + n_requests))
    out: dict[str, list[RequestResult]] = {r: [] for r in names}
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30), limits=limits) as client:
        async def worker() -> None:
            for i in counter:
                route = names[i % len(names)]
                out[route].append(await _one(client, base, route, model, i))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def _stream_rate(results: list[RequestResult]) -> float:
    """Tokens per second of streaming per request, after the first token (summed)."""
    toks = sum(r.completion_tokens for r in results if r.ok and r.ttft_s is not None)
    secs = sum(r.latency_s - (r.ttft_s or 0.0) for r in results if r.ok and r.ttft_s is not None)
    return toks / secs if secs > 0 else 0.0


async def sc_dialects(ctx: Ctx) -> list[Table]:
    c = 8
    rounds, per_round = ctx.n(5, 3), 8  # short rounds, many of them: the median ratio resists drift
    t = Table(f"API dialects: streaming chat, c={c}, {MAX_TOKENS} tokens, ignore_eos, one corral server; "
              "ratio = tok/s vs /v1/chat/completions in the same round (median round shown)",
              ["route"] + LOAD_COLUMNS[1:])
    port = free_port()
    cfg = ctx.corral_config("dialects", {"bench": ctx.corral_model(8)})
    srv = start("corral", corral_cmd(cfg, port), port)
    base = f"http://127.0.0.1:{port}"
    by_route: dict[str, list[LoadResult]] = {r: [] for r in ROUTES}
    cpu_ms: dict[str, list[float]] = {r: [] for r in ROUTES}  # router CPU per 1000 tokens
    try:
        for r in ROUTES:  # warm up: load the model, touch every route
            await run_route(base, r, "bench", 2, 2, 900_000)
        idx = 0
        for rnd in range(rounds):
            for r in ROUTES:
                cpu0 = proc_cpu_s(srv.pid) or 0.0
                res = await run_route(base, r, "bench", c, per_round, idx)
                cpu = (proc_cpu_s(srv.pid) or 0.0) - cpu0
                idx += per_round
                by_route[r].append(res)
                cpu_ms[r].append(cpu * 1e6 / max(1, res.completion_tokens))
                log(f"dialects round {rnd + 1} {r}: {res.tok_s:.1f} tok/s, router CPU "
                    f"{cpu_ms[r][-1]:.0f} ms/1k tokens, {res.errors} errors")
        mixed = await run_mixed(base, "bench", c, ctx.n(96, 48), idx)
    finally:
        srv.stop()
    ratios: dict[str, list[float]] = {r: [] for r in ROUTES}
    for rnd in range(rounds):
        ref = by_route["openai"][rnd].tok_s
        for r in ROUTES:
            ratios[r].append(by_route[r][rnd].tok_s / ref if ref else 0.0)
    labels = {"openai": "/v1/chat/completions", "ollama": "/api/chat", "anthropic": "/v1/messages",
              "responses": "/v1/responses"}
    for r, label in labels.items():
        med = statistics.median(ratios[r])
        pick = sorted(range(rounds), key=lambda k: by_route[r][k].tok_s)[rounds // 2]  # its median round
        row = load_row(label, by_route[r][pick], None)
        row[4] = f"{med:.2f}x"
        t.rows.append(row)
    m = Table(f"API dialects, mixed: c={c} clients, request i through route i mod 4 (all routes at the same "
              "moments); streaming rate per request after the first token, ratio vs /v1/chat/completions",
              ["route", "requests", "stream tok/s per request", "ratio", "TTFT p50 ms", "errors"])
    ref = _stream_rate(mixed["openai"])
    for r, label in labels.items():
        rs = mixed[r]
        ttfts = sorted(x.ttft_s * 1000 for x in rs if x.ok and x.ttft_s is not None)
        rate = _stream_rate(rs)
        m.rows.append([label, str(len(rs)), f"{rate:.1f}", f"{rate / ref:.2f}x" if ref else "–",
                       fmt(ttfts[len(ttfts) // 2] if ttfts else None, 0), str(sum(not x.ok for x in rs))])
    t.notes.append("router process CPU per 1000 streamed tokens (median; the translation's own cost, "
                   "much less sensitive to other load than tok/s): " + "; ".join(
                       f"{r} {statistics.median(cpu_ms[r]):.0f} ms" for r in ROUTES))
    t.notes.append("per-round ratios: " + "; ".join(
        f"{r} " + "/".join(f"{x:.2f}" for x in ratios[r]) for r in ROUTES if r != "openai"))
    t.notes.append("tok/s of the median round; every route generates exactly 64 tokens per request "
                   f"(ignore_eos), tok/req {fmt(statistics.mean(x.tokens_per_request or 0 for x in by_route['ollama']), 1)}")
    t.data = {"loads": {r: [x.as_dict() for x in v] for r, v in by_route.items()}, "router_cpu_ms_per_1k": cpu_ms}
    return [t, m]
