"""Scenario ``fairness``: a heavy key at c=16 with long generations and a light key at c=1
with short ones, on one model with 4 slots.

Per server, the light key alone (its TTFT), then with the heavy key running, then alone
again (alone is the requests of both, so a drift of the shared machine's load between the
phases does not bias the ratio): the heavy clients, in a process of their own
(bench/clients/background_load.py), fill the slots and the queue, the light client starts
after a ramp and sends its requests one after another; the heavy clients stop when the
light one is done. Reported: the light key's TTFT p50/p95 with the heavy key
against alone (goal <= 1.5x p50, <= 2x p95), the aggregate tok/s of both keys, and the heavy
key's requests: sent, completed, refused (503): the heavy key is to be slowed, never failed
(a queued request waits while its client does; the scenario runs with the default
``queue_timeout_s``, not the bench's long one, so a queue wait bounded by it would show).

Servers, in one run: corral with two keys and preemption (the fair queue,
corral.control.scheduling.fair_queue, and a heavy sequence paused for the light key:
corral.control.scheduling.preempt), the same with ``preempt = false`` (the fair queue alone),
corral without keys (one anonymous key: its queue is FIFO; the tok/s reference, goal
>= 0.97x) and llama-server -np 4 (FIFO), same client code.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import httpx

from bench.clients.background_load import BackgroundLoad
from bench.clients.loadgen import RequestResult, completion_body, fmt, one_request, pct
from bench.context import SLOT_CTX, Ctx, log, start
from bench.report import Table
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd
from corral.config.keys_file import KeySpec, hash_secret, write_keys

HEAVY_C, SLOTS = 16, 4
# x0.6 with --quick: a server past it gets a row saying so, the others keep theirs. A FIFO server's light
# requests wait behind the whole heavy queue: on a loaded machine llama-server needs more (the env var)
PER_SERVER_S = int(os.environ.get("CORRAL_BENCH_FAIRNESS_SERVER_S", "200"))
SECRETS = {"heavy": "crl_bench-heavy-0123456789abcdef0123", "light": "crl_bench-light-0123456789abcdef0123"}


def _client(secret: str | None, n: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600, connect=30),
                             limits=httpx.Limits(max_connections=n + 2, max_keepalive_connections=n + 2))


async def _light(client: httpx.AsyncClient, url: str, model: str | None, n: int, max_tokens: int,
                 first: int, budget_s: float | None = None) -> list[RequestResult]:
    """``n`` requests one after another; none started after ``budget_s`` (at least two)."""
    out: list[RequestResult] = []
    t0 = time.perf_counter()
    for i in range(n):
        if budget_s is not None and len(out) >= 2 and time.perf_counter() - t0 > budget_s:
            break
        out.append(await one_request(client, url, completion_body(model, first + i, max_tokens), 600))
    return out


async def _contended(base: str, model: str | None, secrets: tuple[str | None, str | None], n_light: int,
                     light_tokens: int, heavy_tokens: int, ramp_s: float, budget_s: float) -> dict[str, Any]:
    """The light client here, the heavy ones in a process of their own (bench/clients/background_load.py):
    16 heavy streams parsed in this event loop would delay the moment the light client reads its first chunk."""
    url = base + "/v1/completions"
    light_c = _client(secrets[1], 1)
    t0 = time.perf_counter()
    heavy = await asyncio.to_thread(BackgroundLoad.start, url, secrets[0], concurrency=HEAVY_C,
                                    max_tokens=heavy_tokens, first_index=100_000, model=model)
    summary: dict[str, Any] = {"requests": 0, "completion_tokens": 0, "errors": 0}
    try:
        await asyncio.sleep(ramp_s)  # the slots and the queue fill with heavy requests
        light = await _light(light_c, url, model, n_light, light_tokens, 500_000, budget_s)
    finally:  # the window ends here: running heavy requests are cut, their tokens count
        try:
            summary = await asyncio.to_thread(heavy.stop)
        finally:
            heavy.kill()
            wall = time.perf_counter() - t0
            await light_c.aclose()
    toks = summary["completion_tokens"] + sum(r.completion_tokens for r in light)
    return {"light": light, "heavy": summary, "wall_s": wall, "tok_s": toks / wall if wall else 0.0}


def _ttft(results: list[RequestResult]) -> tuple[float | None, float | None]:
    v = [r.ttft_s * 1000 for r in results if r.ok and r.ttft_s is not None]
    return pct(v, 50), pct(v, 95)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "–"


async def sc_fairness(ctx: Ctx) -> list[Table]:
    n_light = ctx.n(12, 4)
    light_tokens, heavy_tokens = 16, ctx.n(128, 32)
    t = Table(f"Fairness: heavy key c={HEAVY_C} x {heavy_tokens} tokens, light key c=1 x {light_tokens} "
              f"tokens (up to {n_light} requests), one model with {SLOTS} slots",
              ["server", "light TTFT p50 ms alone", "p95 alone", "light requests with heavy", "p50 with heavy",
               "p95 with heavy",
               "p50 ratio (goal <= 1.5x)", "p95 ratio (goal <= 2x)", "heavy requests",
               "heavy completed / refused (503) (goal: none refused)", "errors",
               "aggregate tok/s", "tok/s vs corral FIFO"])
    data: dict[str, Any] = {}
    fifo_tok_s: float | None = None

    async def one(name: str, srv: Server, model: str | None, secrets: tuple[str | None, str | None]) -> None:
        nonlocal fifo_tok_s
        light_c = _client(secrets[1], 1)
        try:
            for i in range(2):  # unmeasured: the model loads, caches warm
                w = await one_request(light_c, srv.base_url + "/v1/completions",
                                      completion_body(model, 900_000 + i, 8), 300)
                if not w.ok:
                    raise RuntimeError(f"warmup failed: {w.error}")
            log(f"fairness: {name} light alone")
            alone = await _light(light_c, srv.base_url + "/v1/completions", model, n_light, light_tokens, 0)
        finally:
            await light_c.aclose()
        log(f"fairness: {name} light with heavy")
        c = await _contended(srv.base_url, model, secrets, n_light, light_tokens, heavy_tokens, ramp_s=2.0,
                             budget_s=ctx.n(150, 30))
        log(f"fairness: {name} light alone again")  # the machine's load drifts: alone is both sides of it
        light_c = _client(secrets[1], 1)
        try:
            alone += await _light(light_c, srv.base_url + "/v1/completions", model, n_light, light_tokens, 1000)
        finally:
            await light_c.aclose()
        a50, a95 = _ttft(alone)
        h50, h95 = _ttft(c["light"])
        errors = sum(r.error is not None for r in alone + c["light"]) + c["heavy"]["errors"]
        if name.startswith("corral FIFO"):
            fifo_tok_s = c["tok_s"]
        vs = f"{c['tok_s'] / fifo_tok_s:.2f}x" if fifo_tok_s and not name.startswith("corral FIFO") else "–"
        t.rows.append([name, fmt(a50, 0), fmt(a95, 0), str(len(c["light"])), fmt(h50, 0), fmt(h95, 0),
                       _ratio(h50, a50),
                       _ratio(h95, a95), str(c["heavy"]["requests"]),
                       f'{c["heavy"].get("completed", 0)} / {c["heavy"].get("refused", 0)}', str(errors),
                       fmt(c["tok_s"]), vs])
        data[name] = {"alone_ttft_ms": [a50, a95], "with_heavy_ttft_ms": [h50, h95], "tok_s": c["tok_s"],
                      "wall_s": c["wall_s"], "heavy_requests": c["heavy"]["requests"],
                      "heavy_completed": c["heavy"].get("completed", 0),
                      "heavy_refused": c["heavy"].get("refused", 0), "errors": errors}

    async def corral(name: str, keyed: bool, preempt: bool = True) -> None:
        port, srv = free_port(), None
        try:
            server: dict[str, Any] = {"preempt": preempt, "queue_timeout_s": 60.0}  # the default
            if keyed:
                path = ctx.tmp / "fairness-keys.toml"
                write_keys(path, {k: KeySpec(hash=hash_secret(s)) for k, s in SECRETS.items()})
                server["keys_file"] = str(path)
            cfg = ctx.corral_config("fairness", {"bench": ctx.corral_model(SLOTS)}, **server)
            srv = start(f"corral-fairness-{'keys' if keyed else 'fifo'}", corral_cmd(cfg, port), port)
            async with asyncio.timeout(PER_SERVER_S * (0.6 if ctx.quick else 1)):
                await one(name, srv, "bench", (SECRETS["heavy"], SECRETS["light"]) if keyed else (None, None))
        except Exception as e:  # noqa: BLE001
            t.rows.append([name, "FAILED" if not isinstance(e, TimeoutError) else "TIMED OUT"] + ["–"] * 11 + [(str(e).splitlines() or [type(e).__name__])[0][:90]])
        finally:
            if srv:
                srv.stop()

    if "corral" in ctx.args.servers:
        await corral("corral FIFO (no keys: one anonymous key)", keyed=False)
        await corral("corral fair queue, no preemption (two keys)", keyed=True, preempt=False)
        await corral("corral fair queue + preemption (two keys)", keyed=True)
    if "llama-server" in ctx.args.servers and not ctx.args.no_reference:
        port, srv = free_port(), None
        try:
            cmd = llama_server_cmd(ctx.need_llama(), ctx.model, port, n_parallel=SLOTS, slot_ctx=SLOT_CTX,
                                   threads=ctx.threads)
            srv = start("llama-server-fairness", cmd, port)
            async with asyncio.timeout(PER_SERVER_S * (0.6 if ctx.quick else 1)):
                await one(f"llama-server -np {SLOTS} (FIFO)", srv, None, (None, None))
        except Exception as e:  # noqa: BLE001
            t.rows.append(["llama-server", "FAILED" if not isinstance(e, TimeoutError) else "TIMED OUT"] + ["–"] * 11 + [(str(e).splitlines() or [type(e).__name__])[0][:90]])
        finally:
            if srv:
                srv.stop()
    t.notes.append("TTFT of the light key's requests; alone: before and after the contended phase; 'with heavy' starts after a 2 s ramp in which the heavy "
                   "clients (a process of their own) fill the slots and the queue; the light client starts no request after "
                   f"{ctx.n(150, 30)} s of it (at least two). Aggregate tok/s: both keys' completion tokens streamed in the "
                   "contended phase (heavy requests still running at its end are cut). Without preemption a light request waits for the first heavy "
                   "generation to end, then takes its slot ahead of the queued heavy ones; with it, a heavy "
                   "sequence is paused (KV kept in the worker's RAM) and the light request starts at once")
    t.data = data
    return [t]
