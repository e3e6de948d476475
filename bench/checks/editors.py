"""Editors and RAG against llama-server on the same files (issue 22), side by side in one run.

    .venv/bin/python -m bench.checks.editors [--docs 1024] [--embed-docs 64] [--concurrency 4] [--json OUT]

(about 3 minutes on 2 cores; short runs are dominated by noise on a shared machine)

Makes the offline test models (testkit/gguf_models.py: the embedded Gemma with FIM
tokens, a tiny BERT reranker) under ~/.cache/corral-bench/editors/, then for each check
starts llama-server (~/.cache/corral-bench/bin/llama-server, bench/llama_server.py builds
it) and corral on the same file with the same context, batch and threads, one after the
other (never both at once: the machine's cores are shared), and compares:

- infill: the same completions (greedy, /infill with prefix, suffix and extra chunks), in
  the repo-level form and (a copy without the file-separator tokens) the snippet form;
- rerank: every score within 1e-4 and the same order (/v1/rerank);
- embeddings: each within 1e-4 cosine of llama-server's /embedding (one input per request,
  as corral embeds a generative model: a second context on the same weights);
- throughput (documents/s) of rerank and of embeddings, each >= 0.95x llama-server's,
  with the same concurrent clients.

Exit status 0 when every check passes, 1 when one fails, 2 when llama-server is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.llama_server import buffer_args

ROOT = Path(__file__).resolve().parents[2]

CACHE = Path(os.environ.get("CORRAL_BENCH_CACHE", Path.home() / ".cache" / "corral-bench"))
LLAMA_SERVER = CACHE / "bin" / "llama-server"
WORK = CACHE / "editors"
THREADS = 2
N_BATCH = 512

INFILL_CASES = [
    {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n\nprint(add(1, 2))\n"},
    {"input_prefix": "import math\n\ndef circle_area(r):\n    return ", "input_suffix": "\n",
     "input_extra": [{"filename": "geometry.py", "text": "def square(x):\n    return x * x\n"}]},
    {"input_prefix": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n",
     "input_suffix": "\n    def pop(self):\n        return self.items.pop()\n", "prompt": "        "},
    {"input_prefix": "", "input_suffix": "}\n", "input_extra": [{"filename": "a.js", "text": "const x = 1;\n"}]},
    # more extra context than the budget (n_ctx - n_batch + 2): its end is kept
    {"input_prefix": "total = ", "input_suffix": "\n",
     "input_extra": [{"filename": f"m{i}.py", "text": "".join(f"v{i}_{j} = {j}\n" for j in range(150))}
                     for i in range(4)]},
]
QUERY = "what is the capital of france"
WORDS = ("paris france capital city river cat dog code python book music car road sun moon tree water fire "
         "the a of is in and").split()


def _docs(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(4 + i % 9)) for i in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A server in its own process group on a free port; ``stop`` ends the whole group."""

    def __init__(self, name: str, cmd: list[str], port: int, health: str) -> None:
        self.name, self.port, self.health = name, port, health
        self.url = f"http://127.0.0.1:{port}"
        WORK.mkdir(parents=True, exist_ok=True)
        self.log = WORK / f"{name}.log"
        self._fh = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def wait(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=5) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.proc.returncode}); see {self.log}")
                try:
                    if c.get(self.url + self.health).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s:.0f}s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._fh.close()


def llama_server(name: str, model: Path, *, n_parallel: int, ctx: int, extra: list[str]) -> Proc:
    port = _free_port()
    cmd = [str(LLAMA_SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(n_parallel),
           "-c", str(ctx), "-b", str(N_BATCH), "-ub", str(N_BATCH), "-t", str(THREADS), "-tb", str(THREADS),
           "--no-warmup", "-ngl", "0", *buffer_args(), *extra]
    p = Proc(name, cmd, port, "/health")
    p.wait()
    return p


def corral(name: str, model: Path, *, n_parallel: int, ctx: int, settings: dict[str, Any]) -> Proc:
    port = _free_port()
    cfg = Path(tempfile.mkdtemp(prefix="corral-editors-")) / "corral.toml"
    lines = ["[server]", "include_default_model = false", f'log_dir = "{cfg.parent / "logs"}"', "",
             "[models.m]", f'path = "{model}"', f"ctx_len = {ctx}", f"n_parallel = {n_parallel}",
             f"threads = {THREADS}", f"n_batch = {N_BATCH}", "load_on_startup = true"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    cfg.write_text("\n".join(lines) + "\n")
    cmd = [sys.executable, "-c", "from corral.cli.main import app; app()", "serve", "--config", str(cfg),
           "--host", "127.0.0.1", "--port", str(port)]
    env_path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    os.environ["PYTHONPATH"] = env_path
    # the same threads as llama-server's, always: the thread governor would take fewer when
    # other processes load the cores, and a decode on other threads differs in the last
    # digits (greedy output can part at a near tie)
    os.environ["CORRAL_ADAPTIVE_THREADS"] = "0"
    p = Proc(name, cmd, port, "/health")
    p.wait()
    with httpx.Client(timeout=120) as c:  # loaded and answering
        c.get(p.url + "/props", params={"model": "m"})
    return p


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


async def _throughput(url: str, bodies: list[dict[str, Any]], n_docs: int, concurrency: int) -> float:
    """Documents per second over ``bodies`` sent by ``concurrency`` clients."""
    queue = list(bodies)
    async with httpx.AsyncClient(timeout=300) as c:
        async def client() -> None:
            while queue:
                body = queue.pop()
                r = await c.post(url, json=body)
                r.raise_for_status()
        await c.post(url, json=bodies[0])  # warm
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return n_docs / (time.perf_counter() - t0)


def check_infill(fim: Path, name: str = "infill") -> dict[str, Any]:
    def run(p: Proc, model: str | None) -> list[tuple[str, int]]:
        """(text, tokens predicted) per case."""
        out = []
        with httpx.Client(timeout=300) as c:
            for case in INFILL_CASES:
                body = {**case, "n_predict": 24, "temperature": 0, "top_k": 1, "cache_prompt": False,
                        **({"model": model} if model else {})}
                r = c.post(p.url + "/infill", json=body)
                r.raise_for_status()
                out.append((r.json()["content"], r.json()["tokens_predicted"]))
        return out
    ls = llama_server("llama-server-fim", fim, n_parallel=1, ctx=2048, extra=[])
    try:
        ref = run(ls, None)
    finally:
        ls.stop()
    co = corral("corral-fim", fim, n_parallel=1, ctx=2048, settings={})
    try:
        got = run(co, "m")
    finally:
        co.stop()
    same = [a == b for a, b in zip(ref, got)]
    return {"check": name, "ok": all(same) and all(text for text, _ in ref), "cases": len(same),
            "same": sum(same), "llama_server": ref,
            "differ": [{"llama_server": a, "corral": b} for a, b in zip(ref, got) if a != b]}


def check_rerank(reranker: Path, n_docs: int, concurrency: int) -> dict[str, Any]:
    docs = _docs(n_docs)
    bodies = [{"model": "m", "query": QUERY, "documents": docs[i:i + 8]} for i in range(0, n_docs, 8)]

    def scores(p: Proc) -> list[float]:
        with httpx.Client(timeout=300) as c:
            r = c.post(p.url + "/v1/rerank", json={"model": "m", "query": QUERY, "documents": docs[:32]})
            r.raise_for_status()
            res = r.json()["results"]
        by_index = {x["index"]: x["relevance_score"] for x in res}
        return [by_index[i] for i in range(len(res))]

    # scores: one slot on both sides, so each document is decoded alone, as reproducibly on
    # either; with several slots, which documents share a decode differs from run to run in
    # llama-server, and so do the last digits (llama-server against itself: about 4e-3)
    ls = llama_server("llama-server-rerank", reranker, n_parallel=1, ctx=512, extra=["--reranking"])
    try:
        ref = scores(ls)
    finally:
        ls.stop()
    ls = llama_server("llama-server-rerank", reranker, n_parallel=4, ctx=2048, extra=["--reranking"])
    try:
        ref4 = scores(ls)
        ref_rate = asyncio.run(_throughput(ls.url + "/v1/rerank", bodies, n_docs, concurrency))
    finally:
        ls.stop()
    co = corral("corral-rerank", reranker, n_parallel=1, ctx=512, settings={})
    try:
        got = scores(co)
    finally:
        co.stop()
    co = corral("corral-rerank", reranker, n_parallel=4, ctx=2048, settings={})
    try:
        got4 = scores(co)
        rate = asyncio.run(_throughput(co.url + "/v1/rerank", bodies, n_docs, concurrency))
    finally:
        co.stop()
    max_diff = max(abs(a - b) for a, b in zip(ref, got))
    same_order = sorted(range(len(ref)), key=lambda i: -ref[i]) == sorted(range(len(got)), key=lambda i: -got[i])
    ratio = rate / ref_rate
    return {"check": "rerank", "ok": max_diff <= 1e-4 and same_order and ratio >= 0.95, "max_score_diff": max_diff,
            "same_order": same_order, "max_score_diff_4_slots": max(abs(a - b) for a, b in zip(ref4, got4)),
            "docs_per_s": {"corral": rate, "llama_server": ref_rate}, "ratio": ratio}


def check_embeddings(fim: Path, n_docs: int, concurrency: int) -> dict[str, Any]:
    docs = _docs(n_docs)
    texts = docs[:16]
    # vectors: one input per request, one at a time (each decoded alone on either side)
    ls = llama_server("llama-server-embed", fim, n_parallel=4, ctx=2048, extra=["--embeddings", "--pooling", "mean"])
    try:
        with httpx.Client(timeout=300) as c:
            ref = [c.post(ls.url + "/embedding", json={"content": t}).json()[0]["embedding"][0] for t in texts]
        ref_rate = asyncio.run(_throughput(ls.url + "/v1/embeddings", [{"input": d} for d in docs], n_docs,
                                           concurrency))
    finally:
        ls.stop()
    co = corral("corral-embed", fim, n_parallel=4, ctx=2048, settings={})
    try:
        with httpx.Client(timeout=300) as c:
            got = [c.post(co.url + "/v1/embeddings", json={"model": "m", "input": t}).json()["data"][0]["embedding"]
                   for t in texts]
        rate = asyncio.run(_throughput(co.url + "/v1/embeddings", [{"model": "m", "input": d} for d in docs], n_docs,
                                       concurrency))
    finally:
        co.stop()
    worst = min(_cos(a, b) for a, b in zip(ref, got))
    ratio = rate / ref_rate
    return {"check": "embeddings", "ok": worst >= 1 - 1e-4 and ratio >= 0.95, "min_cosine": worst,
            "docs_per_s": {"corral": rate, "llama_server": ref_rate}, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=1024, help="documents per rerank throughput run")
    ap.add_argument("--embed-docs", type=int, default=64, help="inputs per embedding throughput run")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--only", choices=["infill", "rerank", "embeddings"], action="append")
    args = ap.parse_args(argv)
    if not LLAMA_SERVER.exists():
        print(f"llama-server not found at {LLAMA_SERVER} (bench/llama_server.py builds it)", file=sys.stderr)
        return 2
    from testkit.gguf_models import write_fim_model, write_reranker

    from corral.store.embedded import embedded_model_path

    WORK.mkdir(parents=True, exist_ok=True)
    fim, reranker = WORK / "gemma-fim.gguf", WORK / "tiny-reranker.gguf"
    fim_plain = WORK / "gemma-fim-plain.gguf"  # no repository and file-separator tokens
    if not fim.exists():
        write_fim_model(embedded_model_path(), fim)
    if not fim_plain.exists():
        write_fim_model(embedded_model_path(), fim_plain, repo_level=False)
    if not reranker.exists():
        write_reranker(reranker)
    only = set(args.only or ["infill", "rerank", "embeddings"])
    results = []
    if "infill" in only:
        results.append(check_infill(fim))
        results.append(check_infill(fim_plain, "infill without file separators"))
    if "rerank" in only:
        results.append(check_rerank(reranker, args.docs, args.concurrency))
    if "embeddings" in only:
        results.append(check_embeddings(fim, args.embed_docs, args.concurrency))
    for r in results:
        print(json.dumps(r))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
