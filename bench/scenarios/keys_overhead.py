"""Scenario ``keys_overhead``: what keys, limits and usage accounting add to a 1-token
request (issue 23's bound: <= 0.5 ms p50 added against no keys).

Three routers over the same scripted worker (tests/support/fake_worker.py: one 1-token
answer at once, so the numbers are the router's and the client's, not a model's), all up
at once: no keys file; a keys file (the request's key looked up, its scope and model
checked, usage counted and written to SQLite off the request path); a key with rpm, tpm
and concurrency limits (each checked and charged). Sequential non-streamed chats on a
kept-alive connection, in interleaved blocks (every server one block in turn), so a
change in the machine's load touches all three alike. Reported: p10/p50/p95 latency per
server and the p50 added against no keys. The key setups include what issue 33 added: the
request's cache tenant and its token reservation (prompt + max_tokens, settled at the end).

Then what cache isolation costs a team (``sc_shared_prompt``, the real model): one corral
with three keys, alice and bob in one ``cache_group``, carol in none; each round a new long
system prompt (~1,500 tokens, ``swa_full`` so the whole prefix is reusable) that alice sends
first, then bob and carol each ask their own question under it (who goes first alternates).
Bob's first token reuses alice's prefix; carol's is a full prefill, as every tenant's first
request is: the price of isolation, paid once per tenant.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.clients.loadgen import fmt, pct
from bench.context import Ctx, log, start
from bench.report import Table
from bench.servers import Server, corral_cmd, free_port
from corral.config.keys_file import KeySpec, hash_secret, write_keys

FAKE = Path(__file__).resolve().parents[2] / "tests" / "support" / "fake_worker.py"
SECRET = "crl_bench-keys-0123456789abcdef0123456789"
BLOCK = 20
TEAM = {"alice": "team", "bob": "team", "carol": None}  # key -> cache_group


async def sc_keys_overhead(ctx: Ctx) -> list[Table]:
    return [await _router_overhead(ctx), await sc_shared_prompt(ctx)]


async def _router_overhead(ctx: Ctx) -> Table:
    blocks = ctx.n(30, 10)  # per server; BLOCK requests each
    script = ctx.tmp / "keys-overhead-worker.json"
    script.write_text(json.dumps({"tokens": ["x"]}))
    setups: list[tuple[str, KeySpec | None]] = [
        ("no keys", None),
        ("a keys file", KeySpec(hash=hash_secret(SECRET))),
        ("a key with rpm, tpm and concurrency limits",
         KeySpec(hash=hash_secret(SECRET), rpm=10**6, tpm=10**9, concurrency=64)),
    ]
    t = Table(f"Keys overhead: a 1-token chat through the router ({blocks * BLOCK} per setup, interleaved "
              "blocks, a scripted worker)",
              ["setup", "p10 ms", "p50 ms", "p95 ms", "p50 added vs no keys (goal <= 0.5 ms)", "errors"])
    servers: list[Server] = []
    lat: dict[str, list[float]] = {name: [] for name, _ in setups}
    errors = dict.fromkeys(lat, 0)
    clients: list[httpx.AsyncClient] = []
    try:
        for k, (name, spec) in enumerate(setups):
            server: dict[str, Any] = {"worker_command": [sys.executable, str(FAKE)],
                                      "state_dir": str(ctx.tmp / f"keys-overhead-state-{k}")}
            headers = {}
            if spec is not None:
                path = ctx.tmp / f"keys-overhead-keyring-{k}.toml"
                write_keys(path, {"bench": spec})
                server["keys_file"] = str(path)
                headers = {"Authorization": f"Bearer {SECRET}"}
            cfg = ctx.corral_config(f"keys-overhead-{k}", {"bench": {"path": str(script), "n_parallel": 4}},
                                    **server)
            port = free_port()
            servers.append(start(f"corral-keys-overhead-{k}", corral_cmd(cfg, port), port))
            clients.append(httpx.AsyncClient(base_url=servers[-1].base_url, headers=headers, timeout=30))
        body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        for c in clients:  # unmeasured: the worker loads, connections open
            for _ in range(BLOCK):
                (await c.post("/v1/chat/completions", json=body)).raise_for_status()
        log(f"keys_overhead: {blocks} blocks of {BLOCK} per setup")
        for b in range(blocks):
            order = list(range(len(setups)))
            order = order[b % len(order):] + order[: b % len(order)]  # who goes first rotates
            for k in order:
                name, c = setups[k][0], clients[k]
                for _ in range(BLOCK):
                    t0 = time.perf_counter()
                    r = await c.post("/v1/chat/completions", json=body)
                    dt = (time.perf_counter() - t0) * 1000
                    if r.status_code == 200:
                        lat[name].append(dt)
                    else:
                        errors[name] += 1
            await asyncio.sleep(0)
    finally:
        for c in clients:
            await c.aclose()
        for s in servers:
            s.stop()
    base = pct(lat["no keys"], 50)
    for name, _ in setups:
        p50 = pct(lat[name], 50)
        added = "–" if name == "no keys" or p50 is None or base is None else f"{p50 - base:+.2f} ms"
        t.rows.append([name, fmt(pct(lat[name], 10), 2), fmt(p50, 2), fmt(pct(lat[name], 95), 2), added,
                       str(errors[name])])
    t.notes.append("Latency as the client sees it (httpx, the client's own cost included): a POST of a "
                   "1-token chat answered by the scripted worker at once; usage rows go to SQLite in "
                   "batches off the request path (corral.control.keys.usage)")
    t.data = {name: {"p10": pct(v, 10), "p50": pct(v, 50), "p95": pct(v, 95), "n": len(v)} for name, v in lat.items()}
    return t


def _system_prompt(r: int) -> str:
    rules = " ".join(f"Rule {r}.{i}: requests about desk {i % 7} go to the {('north', 'south', 'east')[i % 3]} "
                     f"wing, ticket class {i % 5}, answered within {i % 9 + 1} days." for i in range(55))
    return f"Handbook edition {r}. You are the facilities assistant of a large office. {rules}"


async def sc_shared_prompt(ctx: Ctx) -> Table:
    rounds = ctx.n(6, 2)
    secrets = {name: f"crl_bench-{name}-0123456789abcdef0123456789" for name in TEAM}
    path = ctx.tmp / "shared-prompt-keys.toml"
    write_keys(path, {name: KeySpec(hash=hash_secret(secrets[name]), cache_group=TEAM[name]) for name in TEAM})
    cfg = ctx.corral_config("shared-prompt", {"m": ctx.corral_model(2, ctx_len=2 * 2048, swa_full=True)},
                            keys_file=str(path), state_dir=str(ctx.tmp / "shared-prompt-state"))
    port = free_port()
    server = start("corral-shared-prompt", corral_cmd(cfg, port), port)
    ms: dict[str, list[float]] = {name: [] for name in TEAM}
    cached: dict[str, list[int]] = {name: [] for name in TEAM}
    n_prompt: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as c:
            async def ask(who: str, system: str, question: str) -> None:
                body = {"model": "m", "max_tokens": 1, "temperature": 0,
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
                t0 = time.perf_counter()
                r = await c.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secrets[who]}"})
                r.raise_for_status()
                ms[who].append((time.perf_counter() - t0) * 1000)
                u = r.json()["usage"]
                cached[who].append(u["prompt_tokens_details"]["cached_tokens"])
                n_prompt.append(u["prompt_tokens"])

            await ask("carol", _system_prompt(-1), "Warm-up.")  # unmeasured: the worker loads
            for seen in (ms["carol"], cached["carol"], n_prompt):
                seen.clear()
            log(f"keys_overhead: shared system prompt, {rounds} rounds")
            for r in range(rounds):
                system = _system_prompt(r)
                await ask("alice", system, "Where do tickets about desk 3 go?")
                for who in (("bob", "carol") if r % 2 == 0 else ("carol", "bob")):
                    await ask(who, system, f"{who} asks: how long does a class 2 ticket take?")
    finally:
        server.stop()
    t = Table(f"Cache isolation: a team's shared system prompt (~{pct([float(n) for n in n_prompt], 50) or 0:.0f} "
              f"prompt tokens, {rounds} rounds, one corral, 1-token answers)",
              ["key", "cache_group", "first token p50 ms", "cached prompt tokens p50", "vs carol (no group)"])
    carol = pct(ms["carol"], 50)
    for name in TEAM:
        p50 = pct(ms[name], 50)
        vs = "–" if name != "bob" or not p50 or not carol else f"{carol / p50:.1f}x faster"
        t.rows.append([name + (" (first, the prefix's writer)" if name == "alice" else ""), TEAM[name] or "none",
                       fmt(p50, 0), fmt(pct([float(x) for x in cached[name]], 50), 0), vs])
    t.notes.append("Each round's system prompt is new: alice's request is a full prefill; bob (alice's "
                   "cache_group) reuses it, carol (her own tenant) prefills it again")
    t.data = {name: {"p50_ms": pct(ms[name], 50), "cached_p50": pct([float(x) for x in cached[name]], 50)}
              for name in TEAM}
    return t
