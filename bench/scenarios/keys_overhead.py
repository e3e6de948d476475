"""Scenario ``keys_overhead``: what keys, limits and usage accounting add to a 1-token
request (issue 23's bound: <= 0.5 ms p50 added against no keys).

Three routers over the same scripted worker (tests/support/fake_worker.py: one 1-token
answer at once, so the numbers are the router's and the client's, not a model's), all up
at once: no keys file; a keys file (the request's key looked up, its scope and model
checked, usage counted and written to SQLite off the request path); a key with rpm, tpm
and concurrency limits (each checked and charged). Sequential non-streamed chats on a
kept-alive connection, in interleaved blocks (every server one block in turn), so a
change in the machine's load touches all three alike. Reported: p10/p50/p95 latency per
server and the p50 added against no keys.
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
from corral.keys_file import KeySpec, hash_secret, write_keys

FAKE = Path(__file__).resolve().parents[2] / "tests" / "support" / "fake_worker.py"
SECRET = "crl_bench-keys-0123456789abcdef0123456789"
BLOCK = 20


async def sc_keys_overhead(ctx: Ctx) -> list[Table]:
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
                   "batches off the request path (corral.control.usage)")
    t.data = {name: {"p10": pct(v, 10), "p50": pct(v, 50), "p95": pct(v, 95), "n": len(v)} for name, v in lat.items()}
    return [t]
