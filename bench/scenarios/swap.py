"""Scenario ``swap``: one model at a time, two models alternating, each conversation with a
~2,000-token system prompt: the time to the first token after a swap, split into the load
part and the prompt part.

The two models are the embedded Gemma 3 270M and its FIM variant (another file: the same
weights with FIM token ids, testkit/gguf_models.py), one slot each. Each visit is the
next turn of that model's conversation: its prompt is the conversation so far (system
prompt, earlier questions and answers) plus a new question, as chat clients send it.
(With Gemma 3's sliding window a saved state serves only a prompt that continues all of
it: the state keeps the last n_swa positions of the window layers, so a prompt that
leaves the saved sequence before its end cannot reuse it; see worker/cache/kv_store.py.) Each visit is
``POST /models/load`` (with one model allowed, that swaps the other one out), polled until
``GET /models`` says loaded (the load part), then a streamed completion whose prompt is the
model's system prompt plus a new user turn (the prompt part: until its first token). The
first visit of each model is a cold full prefill; the visits after are the swaps measured.

Rows, all in one run:

- corral, ``max_loaded_models = 1``, the prompt cache off (every swap prefills again);
- corral, the same with the prompt cache on (RAM + disk across the swap: promptcache's
  ``[server] prompt_cache_disk`` and the model's ``prompt_cache_ram``), where this build has it;
- llama.cpp's router mode, ``--models-dir D --models-max 1`` (its children's ``--cache-ram``
  is in RAM only, so lost at every swap).

Goals (issue 24): the prompt part after a swap >= 20x faster than a full prefill; the whole
first token >= 3x faster than without the cache and than llama.cpp's router.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.clients.loadgen import fmt
from bench.context import Ctx, log, start
from bench.report import Table
from bench.llama_server import buffer_args
from bench.servers import Server, ServerFailed, corral_cmd, free_port

IDS = ("swap-a", "swap-b")
SLOT_CTX = 4096
TOPICS = {"swap-a": ("lighthouse", "keeper", "lamp", "storm", "harbour", "ledger"),
          "swap-b": ("orchard", "gardener", "ladder", "frost", "cellar", "basket")}


def system_prompt(mid: str, n_rules: int = 60) -> str:
    """About 2,000 Gemma tokens of rules, different for each model."""
    a, b, c, d, e, f = TOPICS[mid]
    rules = [f"Rule {k}: the {b} of the {a} checks the {c} {k % 7 + 1} times before the {d} "
             f"and writes the count in the {f} kept by the {e} door." for k in range(1, n_rules + 1)]
    return f"You are the {a} assistant. Follow these rules.\n" + "\n".join(rules) + "\n"


def turn_prompt(mid: str, k: int, history: str = "") -> str:
    """The conversation so far (its system prompt, earlier turns and answers) and a new question."""
    return system_prompt(mid) + history + f"User: question {k}: what does rule {k + 3} say?\nAssistant:"


async def _status(c: httpx.AsyncClient, base: str, mid: str) -> str | None:
    r = await c.get(base + "/models")
    for m in r.json().get("data", []) if r.status_code == 200 else []:
        if m.get("id") == mid:
            return (m.get("status") or {}).get("value")
    return None


async def load(c: httpx.AsyncClient, base: str, mid: str) -> float:
    """POST /models/load, then until GET /models says loaded (llama.cpp's router answers the
    call at once and loads in the background; corral answers once loaded)."""
    t0 = time.perf_counter()
    r = await c.post(base + "/models/load", json={"model": mid})
    if r.status_code >= 300 and "already" not in r.text:
        raise ServerFailed(f"POST /models/load {mid} -> HTTP {r.status_code}: {r.text[:200]}")
    while (st := await _status(c, base, mid)) != "loaded":
        if st in ("failed", "unloaded", None) and time.perf_counter() - t0 > 120:
            raise ServerFailed(f"{mid} did not load (status {st})")
        await asyncio.sleep(0.02)  # no event to await across servers
    return time.perf_counter() - t0


async def first_token(c: httpx.AsyncClient, base: str, mid: str, prompt: str) -> tuple[float, int, int, str]:
    """A streamed completion: (seconds to its first token, prompt tokens, cached tokens, its text)."""
    body = {"model": mid, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    t_first: float | None = None
    n_prompt = n_cached = -1
    text = ""
    async with c.stream("POST", base + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise ServerFailed(f"completion -> HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            obj = json.loads(line[5:])
            piece = obj["choices"][0].get("text") if obj.get("choices") else None
            if piece:
                text += piece
                if t_first is None:
                    t_first = time.perf_counter() - t0
            usage = obj.get("usage") or {}
            if usage.get("prompt_tokens"):
                n_prompt = usage["prompt_tokens"]
                n_cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", n_cached)
            timings = obj.get("timings") or {}
            if "cache_n" in timings:
                n_cached = timings["cache_n"]
    if t_first is None:
        raise ServerFailed("no token streamed")
    return t_first, n_prompt, n_cached, text


async def visits(base: str, n_swaps: int) -> dict[str, list[dict[str, float]]]:
    """The cold first visit of each model, then ``n_swaps`` alternating visits; each visit
    is the next turn of that model's conversation (its prompt holds the earlier turns and
    answers, as a chat client sends them)."""
    out: dict[str, list[dict[str, float]]] = {"cold": [], "swap": []}
    history = {mid: "" for mid in IDS}
    async with httpx.AsyncClient(timeout=600) as c:
        order = [*IDS, *(IDS[k % 2] for k in range(n_swaps))]
        for k, mid in enumerate(order):
            t_load = await load(c, base, mid)
            prompt = turn_prompt(mid, k, history[mid])
            t_prompt, n_prompt, n_cached, answer = await first_token(c, base, mid, prompt)
            history[mid] = prompt[len(system_prompt(mid)):] + answer + "\n"
            row = {"load": t_load, "prompt": t_prompt, "whole": t_load + t_prompt, "n_prompt": n_prompt,
                   "n_cached": n_cached}
            out["cold" if k < len(IDS) else "swap"].append(row)
            log(f"swap: {mid} visit {k}: load {t_load:.2f}s, prompt part {t_prompt:.3f}s "
                f"({n_prompt} tokens, {n_cached} cached)")
    return out


def _models(ctx: Ctx, files: dict[str, Path], **extra: Any) -> dict[str, dict[str, Any]]:
    return {mid: {"path": str(p), "n_parallel": 1, "ctx_len": SLOT_CTX, "threads": ctx.threads,
                  "n_gpu_layers": ctx.gpu_layers, **extra} for mid, p in files.items()}


def has_prompt_cache() -> bool:
    from corral.config.file import ServerConfig

    return "prompt_cache_disk" in ServerConfig.model_fields


def model_files(ctx: Ctx) -> dict[str, Path]:
    """The two models' files, in one directory (llama.cpp's --models-dir names them by stem)."""
    d = ctx.tmp / "swap-models"
    d.mkdir(exist_ok=True)
    a, b = d / f"{IDS[0]}.gguf", d / f"{IDS[1]}.gguf"
    if not a.exists():
        os.symlink(os.path.abspath(ctx.model), a)
    if not b.exists():
        from testkit.gguf_models import write_fim_model

        write_fim_model(Path(ctx.model), b)
    return {IDS[0]: a, IDS[1]: b}


async def sc_swap(ctx: Ctx) -> list[Table]:
    n_swaps = ctx.n(6, 2)
    files = model_files(ctx)
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    errors: dict[str, str] = {}

    async def run(name: str, make: Any) -> None:
        srv: Server | None = None
        try:
            srv = make()
            runs[name] = await visits(srv.base_url, n_swaps)
        except Exception as e:  # noqa: BLE001 - one row failing never stops the others
            errors[name] = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        finally:
            if srv is not None:
                srv.stop()

    cache = has_prompt_cache()
    if "corral" in ctx.args.servers:
        off: dict[str, Any] = {"prompt_cache_ram": 0} if cache else {}

        def corral(name: str, models: dict[str, dict[str, Any]], **server: Any) -> Server:
            cfg = ctx.corral_config(name, models, max_loaded_models=1, state_dir=str(ctx.tmp / f"{name}-state"),
                                    **server)
            port = free_port()
            return start(name, corral_cmd(cfg, port), port)

        await run("corral, no prompt cache",
                  lambda: corral("swap-nocache", _models(ctx, files, **off), **({"prompt_cache_disk": 0} if cache else {})))
        if cache:
            await run("corral, prompt cache (RAM + disk)",
                      lambda: corral("swap-cache", _models(ctx, files, prompt_cache_ram="1GiB"),
                                     prompt_cache_disk="2GiB"))
        else:
            errors["corral, prompt cache (RAM + disk)"] = "not in this build (promptcache's branch)"

    if "llama-server" in ctx.args.servers:
        def llama() -> Server:
            binary = ctx.need_llama()
            port = free_port()
            cmd = [str(binary), "--models-dir", str(files[IDS[0]].parent), "--models-max", "1",
                   "--host", "127.0.0.1", "--port", str(port), "-c", str(SLOT_CTX), "-np", "1",
                   "-t", str(ctx.threads), "-tb", str(ctx.threads), "-ngl", str(ctx.gpu_layers), *buffer_args()]
            cache_dir = ctx.tmp / "llama-cache"
            cache_dir.mkdir(exist_ok=True)
            return start("llama-router-swap", cmd, port, env={"LLAMA_CACHE": str(cache_dir)})
        await run("llama.cpp router --models-max 1", llama)

    return [_table(runs, errors, n_swaps)]


def _med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def _table(runs: dict[str, dict[str, list[dict[str, float]]]], errors: dict[str, str], n_swaps: int) -> Table:
    t = Table("Swap: two models alternating, one loaded at a time, ~2,000-token system prompt each: "
              "first token after a swap",
              ["server", "visits", "prompt tokens", "cached (median)", "load s", "prompt part s", "whole s",
               "full prefill s (cold visits)", "prompt part vs full prefill", "whole vs no cache",
               "whole vs llama.cpp router"])
    base = runs.get("corral, no prompt cache")
    ref_whole = _med(base["swap"], "whole") if base else None
    router = runs.get("llama.cpp router --models-max 1")
    router_whole = _med(router["swap"], "whole") if router else None
    full_prefill = _med(base["cold"], "prompt") if base else None
    for name, got in runs.items():
        sw = got["swap"]
        whole = _med(sw, "whole")
        prompt = _med(sw, "prompt")
        cold = _med(got["cold"], "prompt")
        t.rows.append([name, str(len(sw)), str(int(_med(sw, "n_prompt"))), str(int(_med(sw, "n_cached"))),
                       fmt(_med(sw, "load"), 3), fmt(prompt, 3), fmt(whole, 3), fmt(cold, 3),
                       f"{(full_prefill or cold) / prompt:.1f}x faster",
                       f"{ref_whole / whole:.2f}x faster" if ref_whole else "–",
                       f"{router_whole / whole:.2f}x faster" if router_whole else "–"])
    for name, e in errors.items():
        t.rows.append([name, "FAILED", "–", "–", "–", "–", "–", "–", "–", "–", e.replace("|", "/")])
    t.notes.append(f"medians over {n_swaps} swaps after one cold visit of each model; 'load s' = POST /models/load "
                   "until GET /models says loaded; 'prompt part s' = the streamed completion's first token after "
                   "that; 'full prefill s' = the cold visits' prompt part (no cache anywhere yet); "
                   "'faster' ratios = the other time / this row's time (goals: prompt part >= 20x faster than "
                   "a full prefill, whole >= 3x faster than no cache and than llama.cpp's router)")
    t.data = {"runs": runs, "errors": errors}
    return t
