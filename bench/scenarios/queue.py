"""Scenario ``queue``: 1000 concurrent requests to one model with n_parallel 4 and
max_queue 2000: errors, the router's peak RSS and CPU; llama-server -np 4 for reference."""

from __future__ import annotations

from typing import Any

from bench.clients.loadgen import fmt, run_load
from bench.context import SLOT_CTX, Ctx, log, start, warmup
from bench.report import Table
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd, proc_cpu_s, tree_cpu_s


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

