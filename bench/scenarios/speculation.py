"""Scenario ``speculation``: n-gram speculative decoding, corral vs llama-server with and without.

Four servers up at once (idle ones use no CPU), same model, threads and client, 4 slots each:

- corral with ``speculative = "ngram"`` (worker/speculation/speculator.py);
- llama-server with ``--spec-type ngram-simple`` and short n-grams (``--spec-ngram-simple-size-n 3
  --spec-ngram-simple-size-m 16``: on this workload better than the defaults 12/48, which
  rarely find a 12-token match to draft from);
- llama-server without speculation;
- corral without speculation (``speculative = "off"``), to tell speculation's share of a
  ratio from the plain loop's.

Two workloads, streamed /v1/completions with ``ignore_eos``, each request its own prompt:

- ``edit``: a ~300-token code listing and "the same code again, with one name changed:";
  the answer repeats most of the prompt (greedy, 128 tokens);
- ``chat``: the plain story prompts of the other scenarios with llama.cpp's default
  sampling (64 tokens), where drafts rarely hold: speculation must not lose there.

Each (server, workload, c) runs once per round, rounds interleaved; the table shows the
median round's tok/s, and ratios of corral over each llama-server in the same round.
Goals (issue 25): >= 1.0x llama-server-with on both workloads; >= 1.5x llama-server-without
on edit; >= 0.97x on chat.

    .venv/bin/python -m bench.run --only speculation
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from bench.clients.loadgen import SAMPLING, LoadResult, RequestResult, fmt, make_prompt, one_request, summarize
from bench.context import SLOT_CTX, Ctx, log, start
from bench.report import Table
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd

__all__ = ["sc_speculation", "edit_prompt"]

C_LIST = (1, 4)
N_SLOTS = 4
SPEC_ARGS = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "16"]
WORKLOADS = {"edit": 128, "chat": 64}  # max_tokens
_NAMES = ("total", "count", "value", "items", "result", "index", "limit", "offset")


def edit_prompt(i: int) -> str:
    """~300 tokens of code, distinct per ``i``, then the start of its edited copy."""
    a, b = _NAMES[i % len(_NAMES)], _NAMES[(i + 3) % len(_NAMES)]
    funcs = []
    for k in range(6):
        funcs.append(f"def step_{i}_{k}({a}, {b}):\n"
                     f"    \"\"\"Step {k} of job {i}.\"\"\"\n"
                     f"    if {a} > {b}:\n"
                     f"        return {a} - {b} * {k + 1}\n"
                     f"    return {b} + {a} // {k + 2}\n")
    code = "\n".join(funcs)
    return (f"# file job_{i}.py\n{code}\n# the same file, with `{a}` renamed to `x`:\n# file job_{i}.py\n"
            f"def step_{i}_0(x, {b}):\n")


def _body(workload: str, i: int, model: str | None, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": max_tokens or WORKLOADS[workload], "stream": True, "ignore_eos": True,
                            "stream_options": {"include_usage": True}}
    if workload == "edit":
        body.update(prompt=edit_prompt(i), temperature=0.0)
    else:
        body.update(prompt=make_prompt(i), **SAMPLING)
    if model is not None:
        body["model"] = model
    return body


async def _load(base: str, model: str | None, workload: str, c: int, n: int, first: int, label: str,
                max_tokens: int | None = None) -> LoadResult:
    url = base.rstrip("/") + "/v1/completions"
    results: list[RequestResult] = []
    order = iter(range(first, first + n))
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=30.0)) as client:
        async def worker() -> None:
            for i in order:
                res = RequestResult(ok=False)
                results.append(res)
                await one_request(client, url, _body(workload, i, model, max_tokens), 300.0, res)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(c)))
        wall = time.perf_counter() - t0
    return summarize(label, c, results, wall)


async def _spec_stats(base: str) -> dict[str, Any] | None:
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(base + "/models")
        if r.status_code != 200:
            return None
        for m in r.json().get("data", []):
            if m.get("id") == "bench" and m.get("instances"):
                spec: dict[str, Any] | None = m["instances"][0].get("speculation")
                return spec
    return None


async def run_rounds(ctx: Ctx, servers: dict[str, Server], models: dict[str, str | None], rounds: int,
                     label: str) -> dict[tuple[str, str, int], list[LoadResult]]:
    """Warm every server up, then ``rounds`` rounds of each (workload, c) over the servers in
    turn: each server's result per (name, workload, c), one a round."""
    for name, srv in servers.items():
        for w in WORKLOADS:
            await _load(srv.base_url, models[name], w, 2, 2, 900_000, f"warm {name}", max_tokens=16)
    results: dict[tuple[str, str, int], list[LoadResult]] = {}
    idx = 0
    for rnd in range(rounds):
        for w in WORKLOADS:
            for c in C_LIST:
                n = ctx.n(2, 1) * c
                for name, srv in servers.items():
                    r = await _load(srv.base_url, models[name], w, c, n, idx, f"{name} {w} c={c}")
                    results.setdefault((name, w, c), []).append(r)
                    log(f"{label} round {rnd + 1}/{rounds}: {name} {w} c={c}: {r.tok_s:.1f} tok/s, {r.errors} errors")
                idx += n
    return results


async def sc_speculation(ctx: Ctx) -> list[Table]:
    rounds = ctx.n(2, 1)
    t = Table("Speculative decoding (n-gram): /v1/completions, stream, ignore_eos, 4 slots each; edit = "
              "a 300-token code listing copied with one rename (greedy, 128 tokens), chat = story prompts "
              "(default sampling, 64 tokens); ratios = corral tok/s over each llama-server's, same round "
              "(median round)",
              ["workload", "c", "corral ngram tok/s", "llama-server ngram tok/s", "llama-server plain tok/s",
               "corral plain tok/s", "vs ngram", "vs plain", "vs corral plain", "errors"])
    servers: dict[str, Server] = {}
    models: dict[str, str | None] = {"corral": "bench", "ls-ngram": None, "ls-plain": None, "corral-plain": "bench"}
    try:
        port = free_port()
        cfg = ctx.corral_config("speculation", {"bench": ctx.corral_model(N_SLOTS, speculative="ngram")})
        servers["corral"] = start("corral", corral_cmd(cfg, port), port)
        for name, extra in (("ls-ngram", SPEC_ARGS), ("ls-plain", [])):
            lport = free_port()
            cmd = llama_server_cmd(ctx.need_llama(), ctx.model, lport, n_parallel=N_SLOTS, slot_ctx=SLOT_CTX,
                                   threads=ctx.threads) + extra
            servers[name] = start(name, cmd, lport)
        port = free_port()
        cfg = ctx.corral_config("speculation-plain", {"bench": ctx.corral_model(N_SLOTS, speculative="off")})
        servers["corral-plain"] = start("corral-plain", corral_cmd(cfg, port), port)
        results = await run_rounds(ctx, servers, models, rounds, "speculation")
        spec = await _spec_stats(servers["corral"].base_url)
    finally:
        for s in servers.values():
            s.stop()
    data: dict[str, Any] = {"corral_speculation": spec}
    for w in WORKLOADS:
        for c in C_LIST:
            rs = {name: results[(name, w, c)] for name in servers}
            vs_ngram = [a.tok_s / b.tok_s if b.tok_s else 0.0 for a, b in zip(rs["corral"], rs["ls-ngram"])]
            vs_plain = [a.tok_s / b.tok_s if b.tok_s else 0.0 for a, b in zip(rs["corral"], rs["ls-plain"])]
            vs_own = [a.tok_s / b.tok_s if b.tok_s else 0.0 for a, b in zip(rs["corral"], rs["corral-plain"])]
            k = min(range(len(vs_plain)), key=lambda j: abs(vs_plain[j] - statistics.median(vs_plain)))
            t.rows.append([w, str(c), fmt(rs["corral"][k].tok_s), fmt(rs["ls-ngram"][k].tok_s),
                           fmt(rs["ls-plain"][k].tok_s), fmt(rs["corral-plain"][k].tok_s),
                           f"{statistics.median(vs_ngram):.2f}x", f"{statistics.median(vs_plain):.2f}x",
                           f"{statistics.median(vs_own):.2f}x",
                           str(sum(r.errors for v in rs.values() for r in v))])
            data[f"{w} c={c}"] = {name: [r.as_dict() for r in v] for name, v in rs.items()}
    if spec:
        t.notes.append(f"corral after the run (GET /models): acceptance rate {fmt(spec.get('acceptance_rate'), 2)}, "
                       f"tokens per slot-step {fmt(spec.get('tokens_per_step'), 2)}")
    t.notes.append("llama-server ngram: " + " ".join(SPEC_ARGS))
    t.notes.append("goals: >= 1.0x llama-server ngram on both; >= 1.5x llama-server plain on edit; "
                   ">= 0.97x on chat")
    t.data = data
    return [t]
