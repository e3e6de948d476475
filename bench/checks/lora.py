"""LoRA adapters against llama-server --lora on the same files (issue 25), side by side in one run.

    PYTHONPATH=src:tests .venv/bin/python -m bench.checks.lora [--tokens 24] [--concurrency 8] [--json OUT]

(about 3 minutes on 2 cores.) Makes two rank-4 adapters for the embedded Gemma
(testkit/gguf_lora.py) under ~/.cache/corral-bench/lora/, then starts llama-server
(``--lora a --lora b``) and corral (``lora = [a, b]``) on the same files with the same context,
batch and threads, one after the other, and measures:

- greedy tokens: the same prompts with no adapter, with a at scale 1 and with b at scale 1
  (llama-server's per-request ``lora`` field on /completion, corral's on /v1/completions),
  one request at a time; a text that parts is reported with the place where it parts.
  llama-server runs with ``--ctx-checkpoints 0``: with checkpoints (its default for a
  sliding-window model) it decodes a prompt's last 4 tokens in a batch of their own, whose
  logits differ in the last digits from those of the whole prompt's batch, and greedy texts
  part at near ties (with no adapter too);
- throughput: ``concurrency`` clients at once (one request each, ``tokens`` tokens, ignore_eos)
  with no adapter, and with half the clients on adapter a and half on b (two adapter sets),
  on both servers: each one's tok/s and the two-sets/none ratio.

Exit status 0 when the greedy texts match, 1 when one parts, 2 when llama-server is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.checks.editors import CACHE, LLAMA_SERVER, N_BATCH, ROOT, THREADS, Proc, _free_port, llama_server

WORK = CACHE / "lora"
PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,",
           "def fibonacci(n):\n", "The three primary colors are"]
CASES = {"none": None, "a": [{"id": 0, "scale": 1.0}], "b": [{"id": 1, "scale": 1.0}]}


def _adapters(model: Path) -> tuple[Path, Path]:
    from testkit.gguf_lora import write_lora

    WORK.mkdir(parents=True, exist_ok=True)
    a, b = WORK / "lora-a.gguf", WORK / "lora-b.gguf"
    if not a.exists():
        write_lora(model, a, seed=7)
    if not b.exists():
        write_lora(model, b, seed=8)
    return a, b


def _corral(model: Path, a: Path, b: Path, *, n_parallel: int, ctx: int) -> Proc:
    port = _free_port()
    cfg = Path(tempfile.mkdtemp(prefix="corral-lora-")) / "corral.toml"
    cfg.write_text("\n".join([
        "[server]", "include_default_model = false", f'log_dir = "{cfg.parent / "logs"}"', "",
        "[models.m]", f'path = "{model}"', f"ctx_len = {ctx}", f"n_parallel = {n_parallel}",
        f"threads = {THREADS}", f"n_batch = {N_BATCH}", "load_on_startup = true",
        f'lora = [{{ id = "a", path = "{a}", scale = 0.0 }}, {{ id = "b", path = "{b}", scale = 0.0 }}]']) + "\n")
    cmd = [sys.executable, "-c", "from corral.cli.main import app; app()", "serve", "--config", str(cfg),
           "--host", "127.0.0.1", "--port", str(port)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    os.environ["CORRAL_ADAPTIVE_THREADS"] = "0"  # the same threads as llama-server's
    p = Proc("corral", cmd, port, "/health")
    p.wait()
    with httpx.Client(timeout=120) as c:
        c.get(p.url + "/props", params={"model": "m"})
    return p


def _body(kind: str, prompt: str, lora: list[dict[str, Any]] | None, n: int, *, ignore_eos: bool) -> tuple[str, dict[str, Any]]:
    if kind == "llama-server":  # scale 0 for every adapter: the base (its defaults are 1)
        body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False,
                "lora": lora if lora is not None else [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}],
                "ignore_eos": ignore_eos}
        return "/completion", body
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": ignore_eos}
    if lora is not None:
        body["lora"] = lora
    return "/v1/completions", body


def _text(kind: str, data: dict[str, Any]) -> str:
    return str(data["content"] if kind == "llama-server" else data["choices"][0]["text"])


def greedy(kind: str, url: str, n: int) -> dict[str, str]:
    out = {}
    with httpx.Client(timeout=300) as c:
        for case, lora in CASES.items():
            for i, prompt in enumerate(PROMPTS):
                # a distinct prompt per request on corral too: no slot serves a cached prefix
                path, body = _body(kind, prompt, lora, n, ignore_eos=True)
                r = c.post(url + path, json=body)
                r.raise_for_status()
                out[f"{case}/{i}"] = _text(kind, r.json())
    return out


async def throughput(kind: str, url: str, concurrency: int, n: int, two_sets: bool) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        async def one(i: int) -> int:
            lora = (CASES["a"] if i % 2 else CASES["b"]) if two_sets else None
            path, body = _body(kind, f"Story {i}: once upon a time", lora, n, ignore_eos=True)
            r = await c.post(url + path, json=body)
            r.raise_for_status()
            return n
        await one(0)  # warm
        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(concurrency)))
        return sum(done) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not LLAMA_SERVER.exists():
        print(f"llama-server missing at {LLAMA_SERVER} (python -m bench.llama_server builds it)")
        return 2
    from corral.store.embedded import embedded_model_path

    model = embedded_model_path()
    a, b = _adapters(model)
    n_par, ctx = args.concurrency, 512 * args.concurrency
    results: dict[str, Any] = {}
    texts: dict[str, dict[str, str]] = {}
    for kind in ("llama-server", "corral"):
        if kind == "llama-server":
            p = llama_server("llama-server", model, n_parallel=n_par, ctx=ctx, extra=["--lora", str(a), "--lora", str(b), "--ctx-checkpoints", "0"])
        else:
            p = _corral(model, a, b, n_parallel=n_par, ctx=ctx)
        try:
            texts[kind] = greedy(kind, p.url, args.tokens)
            none = asyncio.run(throughput(kind, p.url, args.concurrency, args.tokens, False))
            two = asyncio.run(throughput(kind, p.url, args.concurrency, args.tokens, True))
            results[kind] = {"tok_s_none": round(none, 1), "tok_s_two_sets": round(two, 1),
                             "ratio": round(two / none, 3)}
        finally:
            p.stop()
    same = [k for k in texts["corral"] if texts["corral"][k] == texts["llama-server"][k]]
    parted = {}
    for k in texts["corral"]:
        x, y = texts["corral"][k], texts["llama-server"][k]
        if x != y:
            at = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            parted[k] = {"at_char": at, "corral": x, "llama-server": y}
    results["greedy"] = {"same": len(same), "of": len(texts["corral"]), "parted": parted}
    results["differs_from_base"] = sum(texts["corral"][f"{c}/{i}"] != texts["corral"][f"none/{i}"]
                                       for c in ("a", "b") for i in range(len(PROMPTS)))
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if not parted else 1


if __name__ == "__main__":
    sys.exit(main())
