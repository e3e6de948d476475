"""Scenario ``speculation-draft`` (also the last table of ``speculation``): draft-model
speculative decoding, corral vs llama-server, with the speculation scenario's workloads.

Three servers up at once, same model, threads and client, 4 slots each:

- corral with ``speculative = "draft"`` and ``draft_model`` (worker/speculation/draft.py);
- llama-server with the same draft (``-md``, ``--spec-draft-n-max 16 --spec-draft-n-min 2
  --spec-draft-p-min 0.75``: corral's defaults; ``CORRAL_BENCH_DRAFT_P_MIN`` sets both servers');
- corral without speculation.

The draft is ``CORRAL_BENCH_DRAFT`` (a GGUF with the model's vocabulary), else the model
itself: on a CPU a self-draft is a correctness case, not a speed one (every draft token
costs a whole decode of the same model), so its ratios say what drafting costs there, and
its acceptance rate (GET /models) that the drafts are the model's own. bench/gpu/run.sh
runs it with a generated pair (a 1.1B-shaped target, a small draft with the same vocabulary).

    .venv/bin/python -m bench.run --only speculation-draft
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.clients.loadgen import fmt
from bench.context import SLOT_CTX, Ctx, start
from bench.report import Table
from bench.scenarios.speculation import C_LIST, N_SLOTS, WORKLOADS, _spec_stats, run_rounds
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd

__all__ = ["sc_speculation_draft", "DRAFT_ARGS"]

P_MIN = os.environ.get("CORRAL_BENCH_DRAFT_P_MIN", "0.75")  # random-weight pairs are flat: 0 there
DRAFT_ARGS = ["--spec-draft-n-max", "16", "--spec-draft-n-min", "2", "--spec-draft-p-min", P_MIN]


async def sc_speculation_draft(ctx: Ctx) -> list[Table]:
    draft = os.environ.get("CORRAL_BENCH_DRAFT") or ctx.model
    own = draft == ctx.model
    rounds = ctx.n(2, 1)
    t = Table(f"Speculative decoding with a draft model ({'the model itself' if own else os.path.basename(draft)}): "
              "/v1/completions, stream, ignore_eos, 4 slots each; workloads as above; ratios = corral draft "
              "tok/s over each other server's, same round (median round)",
              ["workload", "c", "corral draft tok/s", "llama-server draft tok/s", "corral plain tok/s",
               "vs llama-server draft", "vs corral plain", "errors"])
    servers: dict[str, Server] = {}
    models: dict[str, str | None] = {"corral": "bench", "ls-draft": None, "corral-plain": "bench"}
    try:
        port = free_port()
        cfg = ctx.corral_config("speculation-draft", {"bench": ctx.corral_model(
            N_SLOTS, speculative="draft", draft_model=draft, draft_p_min=float(P_MIN))})
        servers["corral"] = start("corral", corral_cmd(cfg, port), port)
        lport = free_port()
        cmd = llama_server_cmd(ctx.need_llama(), ctx.model, lport, n_parallel=N_SLOTS, slot_ctx=SLOT_CTX,
                               threads=ctx.threads, gpu_layers=ctx.gpu_layers)
        servers["ls-draft"] = start("ls-draft", [*cmd, "-md", draft, "-ngld", str(ctx.gpu_layers), *DRAFT_ARGS],
                                    lport)
        port = free_port()
        cfg = ctx.corral_config("speculation-draft-plain", {"bench": ctx.corral_model(N_SLOTS, speculative="off")})
        servers["corral-plain"] = start("corral-plain", corral_cmd(cfg, port), port)
        results = await run_rounds(ctx, servers, models, rounds, "speculation-draft")
        spec = await _spec_stats(servers["corral"].base_url)
    finally:
        for s in servers.values():
            s.stop()
    data: dict[str, Any] = {"corral_speculation": spec, "draft_model": draft}
    for w in WORKLOADS:
        for c in C_LIST:
            rs = {name: results[(name, w, c)] for name in servers}
            vs_ls = [a.tok_s / b.tok_s if b.tok_s else 0.0 for a, b in zip(rs["corral"], rs["ls-draft"])]
            vs_own = [a.tok_s / b.tok_s if b.tok_s else 0.0 for a, b in zip(rs["corral"], rs["corral-plain"])]
            k = min(range(len(vs_own)), key=lambda j: abs(vs_own[j] - statistics.median(vs_own)))
            t.rows.append([w, str(c), fmt(rs["corral"][k].tok_s), fmt(rs["ls-draft"][k].tok_s),
                           fmt(rs["corral-plain"][k].tok_s), f"{statistics.median(vs_ls):.2f}x",
                           f"{statistics.median(vs_own):.2f}x", str(sum(r.errors for v in rs.values() for r in v))])
            data[f"{w} c={c}"] = {name: [r.as_dict() for r in v] for name, v in rs.items()}
    if spec:
        t.notes.append(f"corral after the run (GET /models): method {spec.get('method')}, acceptance rate "
                       f"{fmt(spec.get('acceptance_rate'), 2)}, tokens per slot-step {fmt(spec.get('tokens_per_step'), 2)}")
    t.notes.append("llama-server draft: -md DRAFT " + " ".join(DRAFT_ARGS))
    if own:
        t.notes.append("the model drafts for itself: a correctness case (acceptance), not a speed one")
    t.data = data
    return [t]
