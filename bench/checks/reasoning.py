"""Reasoning split check: corral against llama-server on the same GGUF and chat template.

    .venv/bin/python -m bench.checks.reasoning                 # texts + cost (~2 min on 2 cores)
    .venv/bin/python -m bench.checks.reasoning --skip-cost     # texts only

1. Texts. A chat template that opens ``<think>`` in the generation prompt and a few-shot
   system prompt, so the embedded Gemma (no ``<think>`` token: every tag spans several
   tokens) thinks and closes the tag itself, then answers. Each prompt runs
   greedy on corral (``reasoning_format = "deepseek"``, streamed and not) and on
   llama-server (``--jinja --chat-template-file ... --reasoning-format deepseek``); the
   ``reasoning_content`` and ``content`` must be the same (compared without the whitespace
   around them: llama-server keeps the newline before ``</think>``, corral drops it).
   Without llama-server
   (~/.cache/corral-bench/bin/llama-server or $LLAMA_SERVER) the corral side is checked
   against its own unsplit text (``reasoning_format = "none"``) parsed here.
2. Cost. c=8 streamed chats with ``ignore_eos`` (every request generates max_tokens) on
   the same model with the split and without (``reasoning_format = "none"``), in turns;
   prints both tok/s and the ratio (the goal: the split costs at most 3%). On a busy
   machine the rounds scatter more than that, so the split's own CPU time per token is
   measured too (the worker's output step on real Gemma pieces, with and without the
   split) and put against the time per token the c=8 load took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.llama_server import find as find_llama_server
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd, stop_all

# Renders an assistant turn's reasoning_content between the tags (llama-server finds a
# template's thinking markers that way) and opens the thinking in the generation prompt, as
# DeepSeek R1's and Qwen3's templates do.
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: "
            "{% if m['reasoning_content'] %}<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
            "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: <think>\n{% endif %}")
SHOTS = "".join(f"user: What is {a}+{a}?\nassistant: <think>\n{a} plus {a} is {2 * a}.\n</think>\n\n"
                f"The answer is {2 * a}.\n" for a in (1, 2, 3, 4))
THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*(.*)$", re.S)


def embedded_model() -> str:
    from corral.store.embedded import embedded_model_path

    return str(embedded_model_path())


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SHOTS}, {"role": "user", "content": f"What is {5 + i}+{5 + i}?"}]


def body(model: str, i: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": messages(i), "temperature": 0, "max_tokens": max_tokens,
            "stop": ["\nuser:"], **extra}


async def chat(c: httpx.AsyncClient, base: str, b: dict[str, Any]) -> tuple[str, str]:
    r = await c.post(base + "/v1/chat/completions", json=b)
    r.raise_for_status()
    msg = r.json()["choices"][0]["message"]
    return (msg.get("reasoning_content") or "").strip(), (msg.get("content") or "").strip()


async def chat_stream(c: httpx.AsyncClient, base: str, b: dict[str, Any]) -> tuple[str, str, int]:
    thought, answer, n = [], [], 0
    async with c.stream("POST", base + "/v1/chat/completions",
                        json={**b, "stream": True, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                n = obj["usage"]["completion_tokens"]
            for ch in obj.get("choices") or []:
                d = ch.get("delta") or {}
                thought.append(d.get("reasoning_content") or "")
                answer.append(d.get("content") or "")
    return "".join(thought).strip(), "".join(answer).strip(), n


def unsplit(text: str) -> tuple[str, str]:
    m = THINK.match(text)
    return (m.group(1).strip(), m.group(2).strip()) if m else ("", text.strip())


async def check_texts(corral: str, llama: str | None, n: int, max_tokens: int) -> bool:
    ok = True
    async with httpx.AsyncClient(timeout=300) as c:
        for i in range(n):
            got = await chat(c, corral, body("split", i, max_tokens))
            st = await chat_stream(c, corral, body("split", i, max_tokens))
            if llama is not None:
                ref = await chat(c, llama, body("m", i, max_tokens))
                where = "llama-server"
            else:
                raw = await chat(c, corral, body("nosplit", i, max_tokens))
                ref, where = unsplit(raw[1]), "corral unsplit"
            same = got == ref == st[:2]
            ok &= same and bool(got[0]) and bool(got[1])
            print(f"prompt {i}: {'same' if same else 'DIFFERENT'}  reasoning={got[0]!r} answer={got[1]!r}"
                  + ("" if same else f"  {where}={ref!r} stream={st[:2]!r}"))
    return ok


async def load(base: str, model: str, concurrency: int, n_requests: int, max_tokens: int) -> float:
    async with httpx.AsyncClient(timeout=600) as c:
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> int:
            async with sem:
                return (await chat_stream(c, base, body(model, i, max_tokens, ignore_eos=True, stop=[])))[2]

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(n_requests))))
        return tokens / (time.perf_counter() - t0)


def split_cost_us(model: str, n_tokens: int = 20000) -> tuple[float, float]:
    """Microseconds per token of the output step (SlotOutput.token) without and with the
    split, over a real thinking-then-answer token stream of the model."""
    import llama_cpp as ll

    from corral.model import reasoning_format
    from corral.worker.reasoning.plan import ReasoningPlan, SlotReasoning
    from corral.worker.output.slot_output import SlotOutput

    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    m = ll.llama_load_model_from_file(model.encode(), params)
    vocab = ll.llama_model_get_vocab(m)
    text = "5 plus 5 is 10, so the answer is ten. " * 8 + "</think>\n\nThe answer is 10. " * 8
    data = text.encode()
    arr = (ll.llama_token * (len(data) + 8))()
    n = ll.llama_tokenize(vocab, data, len(data), arr, len(arr), False, True)
    buf = ll.ctypes.create_string_buffer(64)
    pieces = []
    for t in arr[:n]:
        k = ll.llama_token_to_piece(vocab, t, buf, 64, 0, False)
        pieces.append(buf.raw[:k])
    fmt = reasoning_format.FORMATS["deepseek"]
    out = []
    for with_split in (False, True):
        t0, done = time.perf_counter(), 0
        while done < n_tokens:
            r = SlotReasoning(ReasoningPlan(fmt, "reasoning", "", -1), [], [1, 2], [], None) if with_split else None
            so = SlotOutput("x", [], None, r)
            for p in pieces:
                so.token(p, None)
            so.finish()
            done += len(pieces)
        out.append((time.perf_counter() - t0) / done * 1e6)
    ll.llama_model_free(m)
    return out[0], out[1]


def toml(models: dict[str, dict[str, Any]], log_dir: str) -> str:
    lines = ["[server]", "include_default_model = false", f"log_dir = {json.dumps(log_dir)}"]
    for mid, m in models.items():
        lines += ["", f'[models."{mid}"]'] + [f"{k} = {json.dumps(v)}" for k, v in m.items()]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded Gemma)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16, help="per round of the cost check")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-cost", action="store_true")
    a = ap.parse_args()
    model = a.model or embedded_model()
    tmp = Path(tempfile.mkdtemp(prefix="corral-reasoning-"))
    tpl = tmp / "template.jinja"
    tpl.write_text(TEMPLATE)
    common = {"path": model, "chat_template": TEMPLATE, "n_parallel": a.concurrency,
              "ctx_len": a.concurrency * 1024, "threads": a.threads}
    cfg = tmp / "corral.toml"
    cfg.write_text(toml({"split": {**common, "reasoning_format": "deepseek"},
                         "nosplit": {**common, "reasoning_format": "none"}}, str(tmp / "logs")))
    servers: list[Server] = []
    try:
        corral = Server("reasoning-corral", corral_cmd(cfg, port := free_port()), port).start()
        servers.append(corral)
        corral.wait_healthy(300)
        binary = find_llama_server()
        llama = None
        if binary is None:
            print("llama-server not found (bench/llama_server.py builds it): comparing with corral's unsplit text")
        else:
            cmd = llama_server_cmd(binary, model, port := free_port(), n_parallel=a.concurrency, slot_ctx=1024,
                                   threads=a.threads)
            cmd += ["--jinja", "--chat-template-file", str(tpl), "--reasoning-format", "deepseek", "-a", "m"]
            llama = Server("reasoning-llama-server", cmd, port).start()
            servers.append(llama)
            llama.wait_healthy(300)
        ok = asyncio.run(check_texts(corral.base_url, llama.base_url if llama else None, a.prompts, a.max_tokens))
        print("texts:", "same" if ok else "DIFFERENT")
        if not a.skip_cost:
            split, plain = [], []
            asyncio.run(load(corral.base_url, "split", a.concurrency, a.concurrency, 8))  # warm both
            asyncio.run(load(corral.base_url, "nosplit", a.concurrency, a.concurrency, 8))
            for r in range(a.rounds):
                order = ("split", "nosplit") if r % 2 == 0 else ("nosplit", "split")
                for m in order:
                    rate = asyncio.run(load(corral.base_url, m, a.concurrency, a.requests, 64))
                    (split if m == "split" else plain).append(rate)
                    print(f"round {r}: {m:8s} {rate:7.1f} tok/s")
            s, p = sum(split) / len(split), sum(plain) / len(plain)
            print(f"c={a.concurrency}: split {s:.1f} tok/s, none {p:.1f} tok/s, ratio {s / p:.3f} "
                  f"(rounds: {', '.join(f'{x / y:.3f}' for x, y in zip(split, plain))})")
            base_us, split_us = split_cost_us(model)
            per_token_us = 1e6 / p  # the engine thread's time per generated token at c=8
            print(f"output step: {base_us:.2f} us/token without the split, {split_us:.2f} with: the split adds "
                  f"{split_us - base_us:.2f} us = {(split_us - base_us) / per_token_us * 100:.2f}% of the "
                  f"{per_token_us:.0f} us per token at c={a.concurrency}")
        return 0 if ok else 1
    finally:
        for s in servers:
            s.stop(grace_s=3.0)
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
