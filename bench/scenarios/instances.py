"""Scenario ``instances``: one model as 1 vs 2 instances (8 slots each), c=16 (corral only)."""

from __future__ import annotations

from bench.clients.loadgen import fmt, run_load
from bench.context import Ctx, set_loaded, start, warmup
from bench.report import Table, ratio
from bench.servers import corral_cmd, free_port


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
            await set_loaded(srv.base_url, (mid,), tuple(m for m in ids.values() if m != mid))
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

