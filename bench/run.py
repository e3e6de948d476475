"""corral benchmarks: corral vs llama.cpp's llama-server vs llama-cpp-python's server.

Everything runs in ONE invocation on the same machine, same model, same thread
count, same client code, and prints markdown tables with absolute numbers and
ratios. Results also go to ``bench/results/`` (gitignored).

    .venv/bin/python -m bench.run                     # all scenarios (< 15 min)
    .venv/bin/python -m bench.run --quick             # smaller counts (< 5 min)
    .venv/bin/python -m bench.run --only throughput   # or overhead, multimodel, coldstart, queue
    .venv/bin/python -m bench.run --only throughput --repeat 5   # the ratios of 5 runs side by side

Scenarios (see bench/README.md):
  throughput  c=1, 8, 32 and 64 streaming, 64 tokens: llama-server -np 64, llama-cpp-python (c<=8), corral
  default_slots  corral's default slots ("auto", sized from memory) vs 4, 64 clients at once (bench/scenarios/throughput.py)
  overhead    one corral worker reached directly over its socket vs through the HTTP router
  multimodel  two model ids (4 slots each) at c=4 each at once vs one model (8 slots) at c=8; llama.cpp router too
  coldstart   POST /models/load -> first token; corral vs llama.cpp router mode
  queue       1000 concurrent requests, n_parallel 4, max_queue 2000: errors, router peak RSS
  instances   one model as 1 vs 2 instances (8 slots each), c=16 (corral only)
  dialects    c=8 streaming through /v1/chat/completions, Ollama, Anthropic, Responses (bench/scenarios/dialects.py)
  sampling    c=8 with a JSON schema and with top_logprobs 5 vs without, corral and llama-server (bench/scenarios/sampling.py)
  fairness    heavy key c=16 long vs light key c=1 short, 4 slots: light TTFT, corral keys/FIFO, llama-server (bench/scenarios/fairness.py)
  keys_overhead  a 1-token chat through keys, limits and usage vs no keys (bench/scenarios/keys_overhead.py)
  speculation n-gram speculative decoding: edit and chat, c=1 and c=4, corral vs llama-server with/without (bench/scenarios/speculation.py)
  swap        one model at a time, two alternating, 2,000-token system prompts: first token after a swap, prompt cache on/off, llama.cpp router (bench/scenarios/swap.py)
  router_ceiling  the router alone over workers that answer at once: tokens and requests per router CPU-second,
              added latency at c=1/64/256, goodput past saturation (bench/scenarios/router_ceiling.py)
  variants    a second id of one file as a variant vs own_instances: load -> first token, memory (bench/scenarios/variants.py)
  speculation-draft  a draft model (CORRAL_BENCH_DRAFT, else the model itself): corral vs llama-server -md (bench/scenarios/speculation_draft.py)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import signal
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench import llama_server
from bench.context import SLOT_CTX, Ctx, log
from bench.report import Table, repeat_summary, write_results
from bench.scenarios import (audio, coldstart, dialects, fairness, instances, keys_overhead, multimodel, overhead,
                             queue, router_ceiling, sampling, speculation, speculation_draft, swap,
                             throughput, variants)
from bench.servers import ROOT, stop_all

SCENARIOS = ("throughput", "overhead", "multimodel", "coldstart", "queue", "dialects", "instances", "sampling",
             "fairness", "keys_overhead", "speculation", "speculation-draft", "swap", "router_ceiling",
             "default_slots", "audio", "variants")

# hang guards per scenario (seconds; x0.6 with --quick), far above normal run times
LIMITS_S = {"instances": 300, "throughput": 1500, "overhead": 240, "multimodel": 600, "coldstart": 180, "queue": 600,
            "dialects": 1200, "sampling": 600, "fairness": 700, "keys_overhead": 240, "speculation": 900,
            "speculation-draft": 900, "swap": 900, "router_ceiling": 600,
            "default_slots": 900, "audio": 1500, "variants": 300}

FUNCS: dict[str, Callable[[Ctx], Awaitable[list[Table]]]] = {
    "instances": instances.sc_instances, "throughput": throughput.sc_throughput, "overhead": overhead.sc_overhead,
    "multimodel": multimodel.sc_multimodel, "coldstart": coldstart.sc_coldstart, "queue": queue.sc_queue,
    "dialects": dialects.sc_dialects, "sampling": sampling.sc_sampling, "fairness": fairness.sc_fairness,
    "keys_overhead": keys_overhead.sc_keys_overhead, "speculation": lambda ctx: _speculation(ctx),
    "speculation-draft": speculation_draft.sc_speculation_draft, "swap": swap.sc_swap,
    "router_ceiling": router_ceiling.sc_router_ceiling, "default_slots": throughput.sc_default_slots,
    "audio": audio.sc_audio, "variants": variants.sc_variants}


async def _speculation(ctx: Ctx) -> list[Table]:
    """The n-gram tables, then the draft model's (``speculation-draft`` alone)."""
    return [*await speculation.sc_speculation(ctx), *await speculation_draft.sc_speculation_draft(ctx)]


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
    footer = f"_total {total:.0f}s; command: {' '.join(['python -m bench.run', *sys.argv[1:]])}_"
    print(footer, flush=True)

    md_path, _ = write_results(header, tables, footer)
    log(f"wrote {md_path} and .json")
    shutil.rmtree(ctx.tmp, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run",
                                 description="corral vs llama-server vs llama-cpp-python, side by side")
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
    ap.add_argument("--max-tokens", type=int, default=64,
                    help="throughput: tokens per request (default 64; a CPU-emulated GPU device wants few)")
    ap.add_argument("--llama-kvu", choices=("on", "off"), default="off",
                    help="throughput: llama-server with -kvu (one unified KV cache); default off: the same "
                         "engine's step at 64 slots was 17%% slower unified (bench.probes.kv_unified)")
    ap.add_argument("--concurrency", default="1,8,32,64",
                    help="throughput: comma-separated client counts (default 1,8,32,64); slots = max(8, largest)")
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
