"""Scenario ``sampling``: what constrained sampling and logprobs cost, corral vs llama-server.

Both servers run at once (idle ones use no CPU), same model, same threads, same client.
The same closed-loop load (c=8 clients, streamed /v1/completions, 64 tokens each with
``ignore_eos``, llama.cpp's default sampling, distinct prompts) runs three ways:

- ``plain``: no constraint (each server's reference);
- ``json_schema``: a JSON schema (an array of at least 20 {name, age} objects, so every
  request is still inside the grammar after 64 tokens) sent as the top-level
  ``json_schema`` both servers take;
- ``top_logprobs 5``: corral ``logprobs: 5`` (the completions API's top alternatives);
  llama-server ``n_probs: 5`` (its native name for the same thing).

Rounds are interleaved (every server and mode once per round) so drift of the machine
hits all alike. The ratio is each mode's tok/s over the same server's plain tok/s in the
same round (median round shown). Goals (issue 9): corral json_schema >= 0.8x, corral
top_logprobs >= 0.9x. After the load, 8 concurrent unstreamed constrained requests read
corral's ``timings.grammar_ms`` (grammar checks, resamples and accepts of a request) to
report the grammar's ms per generated token (= per step of that sequence).

    .venv/bin/python -m bench.run --only sampling
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import httpx

from bench.clients.loadgen import SAMPLING, LoadResult, fmt, make_prompt, run_load
from bench.context import SLOT_CTX, Ctx, log, start
from bench.report import Table
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd

__all__ = ["sc_sampling", "SCHEMA"]

MAX_TOKENS = 64
C = 8
SCHEMA = {
    "type": "array", "minItems": 20,
    "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]},
}
MODES = ("plain", "json_schema", "top_logprobs 5")


def _extra(server: str, mode: str) -> dict[str, Any]:
    if mode == "json_schema":
        return {"json_schema": SCHEMA}
    if mode == "top_logprobs 5":
        return {"logprobs": 5} if server == "corral" else {"n_probs": 5}
    return {}


async def _grammar_ms_per_token(base: str, model: str) -> tuple[float | None, float | None]:
    """(grammar ms per generated token, share of the request's generation time) from
    corral's timings on 8 concurrent unstreamed constrained requests."""
    async with httpx.AsyncClient(timeout=300) as client:
        async def one(i: int) -> dict[str, Any]:
            body = {"model": model, "prompt": make_prompt(70_000 + i), "max_tokens": MAX_TOKENS,
                    "ignore_eos": True, "json_schema": SCHEMA, **SAMPLING}
            r = await client.post(base + "/v1/completions", json=body)
            r.raise_for_status()
            timings: dict[str, Any] = r.json()["timings"]
            return timings
        got = await asyncio.gather(*(one(i) for i in range(C)))
    per_tok = [t.get("grammar_ms", 0.0) / t["predicted_n"] for t in got if t.get("predicted_n")]
    share = [t.get("grammar_ms", 0.0) / t["predicted_ms"] for t in got if t.get("predicted_ms")]
    return (statistics.mean(per_tok) if per_tok else None, statistics.mean(share) if share else None)


async def sc_sampling(ctx: Ctx) -> list[Table]:
    rounds, per_round = ctx.n(3, 2), ctx.n(16, 8)
    t = Table(f"Constrained sampling and logprobs: /v1/completions, stream, c={C}, {MAX_TOKENS} tokens, "
              "ignore_eos; ratio = tok/s vs the same server without them, same round (median round)",
              ["server", "mode", "tok/s", "ratio", "TTFT p50 ms", "errors"])
    servers: dict[str, Server] = {}
    models: dict[str, str | None] = {"corral": "bench", "llama-server": None}
    failed: dict[str, str] = {}
    try:
        port = free_port()
        cfg = ctx.corral_config("sampling", {"bench": ctx.corral_model(C)})
        servers["corral"] = start("corral", corral_cmd(cfg, port), port)
        if "llama-server" in ctx.args.servers:
            try:
                lport = free_port()
                servers["llama-server"] = start("llama-server", llama_server_cmd(
                    ctx.need_llama(), ctx.model, lport, n_parallel=C, slot_ctx=SLOT_CTX,
                    threads=ctx.threads), lport)
            except Exception as e:  # noqa: BLE001
                failed["llama-server"] = str(e)
                log(f"llama-server: {e}")
        for name, srv in servers.items():
            for mode in MODES:  # warm up every mode (model load, grammar code paths)
                await run_load(srv.base_url, label=name, model=models[name], concurrency=2, n_requests=2,
                               max_tokens=8, extra=_extra(name, mode), first_index=900_000)
        results: dict[tuple[str, str], list[LoadResult]] = {}
        idx = 0
        for rnd in range(rounds):
            for name, srv in servers.items():
                for mode in MODES:
                    r = await run_load(srv.base_url, label=f"{name} {mode}", model=models[name], concurrency=C,
                                       n_requests=per_round, max_tokens=MAX_TOKENS, extra=_extra(name, mode),
                                       first_index=idx)
                    idx += per_round
                    results.setdefault((name, mode), []).append(r)
                    log(f"sampling round {rnd + 1}/{rounds}: {name} {mode}: {r.tok_s:.1f} tok/s, "
                        f"{r.errors} errors")
        grammar_ms, grammar_share = await _grammar_ms_per_token(servers["corral"].base_url, "bench")
    finally:
        for s in servers.values():
            s.stop()
    data: dict[str, Any] = {}
    for name in servers:
        plain = results[(name, "plain")]
        for mode in MODES:
            rs = results[(name, mode)]
            ratios = [r.tok_s / p.tok_s if p.tok_s else 0.0 for r, p in zip(rs, plain)]
            med = statistics.median(ratios)
            pick = rs[min(range(len(rs)), key=lambda k: abs(ratios[k] - med))]
            t.rows.append([name, mode, fmt(pick.tok_s), f"{med:.2f}x",
                           fmt(pick.ttft_p50_ms),
                           str(sum(r.errors for r in rs))])
            data[f"{name} {mode}"] = {"ratios": ratios, "runs": [r.as_dict() for r in rs]}
            if mode != "plain":
                t.notes.append(f"{name} {mode} vs plain, round by round: " + ", ".join(f"{x:.2f}x" for x in ratios))
    for name, why in failed.items():
        t.rows.append([name, "-", "-", "-", "-", f"failed: {why.splitlines()[0][:120]}"])
    t.notes.append(f"corral grammar time: {fmt(grammar_ms, 3)} ms per generated token "
                   f"({fmt(grammar_share * 100 if grammar_share is not None else None, 1)}% of generation time), "
                   "from timings.grammar_ms of 8 concurrent constrained requests")
    t.notes.append("goals: corral json_schema >= 0.80x, corral top_logprobs 5 >= 0.90x of corral plain")
    data["grammar_ms_per_token"] = grammar_ms
    t.data = data
    return [t]
