"""Audio parity check: corral against llama-server ``--mmproj`` on the same two files.

    .venv/bin/python -m bench.checks.audio [--json OUT]     # 1-4 min on 2 cores, with the load

The files: the embedded Gemma 3 270M and a Qwen2-Audio (``qwen2a``) projector for it written
offline (testkit/gguf_audio.py: a Whisper encoder, 750 positions a started 30 s window;
random weights, so the words mean nothing, but every step is real). The recordings are
testkit/audio_files.py's tone bursts, 16 kHz mono WAV, the same bytes to both servers. Both
servers run one slot, 2 threads (corral's thread governor off: with a thread less for a
step the sums round otherwise, and a random-weight prompt of 1,500 audio positions drifts
to other tokens within a few), ``n_batch`` 512 and the same chat template:
llama-server's own fallback for a GGUF without one (ChatML, ``CHATML_TEMPLATE``), which
corral is given explicitly (for such a GGUF corral renders a plain ``User:``/``Assistant:``
prompt instead, deliberately: the Nitro prompt format).

1. **Prompt tokens** (chat ``input_audio``, 1 s, 29 s, 30 s and 31 s): ``usage.prompt_tokens``
   the same on both, and the audio's part of it (the prompt less the text around the audio:
   the turn and libmtmd's ``<|audio_bos|>``/``<|audio_eos|>``, counted by each server's
   ``/tokenize``) 750, 750, 1,500 and 1,500 (libmtmd's window holds 30 s less 10 ms:
   testkit ``audio_tokens``).
2. **Greedy tokens** (the same requests, temperature 0, ``MAX_TOKENS``): the same text,
   completion token count and token pieces (``logprobs``), and the largest difference of
   their log-probabilities.
3. **Transcription** (``/v1/audio/transcriptions``, json, temperature 0, ``MAX_TOKENS``) of
   the 29 s clip, one window on both: the same input and output token counts and text
   (llama-server asks "Transcribe audio to text" and the audio after it in one user turn;
   corral asks the same: api/openai/audio_routes.py ``instruction``). A recording over 30 s
   is not compared: corral cuts it into windows transcribed side by side, one request
   each, where llama-server reads all its windows in one context, so neither the prompt
   nor the text is expected to match (the 31 s row shows the two counts, not a verdict).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.context import Ctx, start
from bench.llama_server import find as find_llama_server
from bench.scenarios.audio import llama_mmproj_cmd
from bench.servers import Server, corral_cmd, free_port, stop_all

MODEL = "audio"
THREADS = 2
CTX = 4096
N_BATCH = 512
MAX_TOKENS = 24
CLIPS_S = (1, 29, 30, 31)
ASK = "What is said?"
# llama-server's CHATML_TEMPLATE_SRC (common/chat.cpp): its template for a GGUF without one
CHATML_TEMPLATE = ("{%- for message in messages -%}\n"
                   "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
                   "{%- endfor -%}\n"
                   "{%- if add_generation_prompt -%}\n"
                   "  {{- '<|im_start|>assistant\\n' -}}\n"
                   "{%- endif -%}")
# the text before the audio and after it: the turn as ChatML renders it, and the tags libmtmd puts
# around a qwen2a recording (tools/mtmd/mtmd.cpp; plain text to Gemma's tokenizer)
PREFIX = "<|im_start|>user\n<|audio_bos|>"
SUFFIX = "<|audio_eos|>" + ASK + "<|im_end|>\n<|im_start|>assistant\n"


def _chat_body(wav: bytes) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True, "top_logprobs": 1,
            "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}},
                {"type": "text", "text": ASK}]}]}


async def _text_tokens(c: httpx.AsyncClient) -> int:
    """The text around the audio, in tokens: the part before it with the BOS, the part after."""
    n = 0
    for text, special in ((PREFIX, True), (SUFFIX, False)):
        r = await c.post("/tokenize", json={"model": MODEL, "content": text, "add_special": special})
        r.raise_for_status()
        n += len(r.json()["tokens"])
    return n


async def _chat(c: httpx.AsyncClient, wav: bytes) -> dict[str, Any]:
    r = await c.post("/v1/chat/completions", json=_chat_body(wav))
    if r.status_code != 200:
        raise RuntimeError(f"chat: HTTP {r.status_code}: {r.text[:300]}")
    j = r.json()
    ch = j["choices"][0]
    lp = (ch.get("logprobs") or {}).get("content") or []
    return {"prompt_tokens": j["usage"]["prompt_tokens"], "completion_tokens": j["usage"]["completion_tokens"],
            "text": ch["message"]["content"] or "", "pieces": [t["token"] for t in lp],
            "logprobs": [t["logprob"] for t in lp]}


async def _transcribe(c: httpx.AsyncClient, wav: bytes) -> dict[str, Any]:
    r = await c.post("/v1/audio/transcriptions", files={"file": ("clip.wav", wav, "audio/wav")},
                     data={"model": MODEL, "response_format": "json", "temperature": "0",
                           "max_tokens": str(MAX_TOKENS)})
    if r.status_code != 200:
        raise RuntimeError(f"transcription: HTTP {r.status_code}: {r.text[:300]}")
    j = r.json()
    return {"text": j["text"], "input_tokens": j["usage"]["input_tokens"],
            "output_tokens": j["usage"]["output_tokens"]}


async def _side(url: str, clips: dict[int, bytes]) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        out: dict[str, Any] = {"text_tokens": await _text_tokens(c), "chat": {}, "transcription": {}}
        for s, wav in clips.items():
            out["chat"][s] = await _chat(c, wav)
        for s in (29, 31):
            out["transcription"][s] = await _transcribe(c, clips[s])
    return out


def _servers(ctx: Ctx, mmproj: Path) -> tuple[Server, Server]:
    binary = find_llama_server()
    if binary is None:
        raise SystemExit("no llama-server (python -m bench.llama_server builds it)")
    tpl = ctx.tmp / "chatml.jinja"
    tpl.write_text(CHATML_TEMPLATE)
    model = ctx.model
    cfg = ctx.corral_config("audio-parity", {MODEL: ctx.corral_model(
        1, mmproj=str(mmproj), ctx_len=CTX, n_batch=N_BATCH, chat_template=CHATML_TEMPLATE)},
        state_dir=str(ctx.tmp / "state"), prompt_cache_disk=0)  # every run computes its prompts
    port = free_port()
    ls = start("audio-parity-llama-server", llama_mmproj_cmd(binary, model, mmproj, port, threads=THREADS, ctx=CTX)
               + ["-b", str(N_BATCH), "-ub", str(N_BATCH), "--jinja", "--chat-template-file", str(tpl),
                  "-a", MODEL], port)
    try:
        port = free_port()
        co = start("audio-parity-corral", corral_cmd(cfg, port), port, timeout_s=300,
                   env={"CORRAL_ADAPTIVE_THREADS": "0"})  # the same threads as llama-server's, always
    except BaseException:
        ls.stop()
        raise
    return ls, co


def compare(ls: dict[str, Any], co: dict[str, Any]) -> tuple[list[list[str]], bool]:
    """The table's rows and whether every compared row agrees."""
    from testkit.gguf_audio import audio_tokens

    rows: list[list[str]] = []
    ok = True

    def row(what: str, a: Any, b: Any, same: bool | None) -> None:
        nonlocal ok
        ok = ok and same is not False
        rows.append([what, str(a), str(b), "-" if same is None else ("same" if same else "DIFFERENT")])

    row("text tokens around the audio (/tokenize)", ls["text_tokens"], co["text_tokens"],
        ls["text_tokens"] == co["text_tokens"])
    for s in CLIPS_S:
        a, b = ls["chat"][s], co["chat"][s]
        row(f"chat {s} s: prompt tokens", a["prompt_tokens"], b["prompt_tokens"],
            a["prompt_tokens"] == b["prompt_tokens"])
        parts = (a["prompt_tokens"] - ls["text_tokens"], b["prompt_tokens"] - co["text_tokens"])
        row(f"chat {s} s: audio's part (expected {audio_tokens(s)})", parts[0], parts[1],
            parts[0] == parts[1] == audio_tokens(s))
        row(f"chat {s} s: completion tokens", a["completion_tokens"], b["completion_tokens"],
            a["completion_tokens"] == b["completion_tokens"])
        row(f"chat {s} s: greedy text", repr(a["text"]), repr(b["text"]), a["text"] == b["text"])
        row(f"chat {s} s: token pieces (logprobs)", len(a["pieces"]), len(b["pieces"]),
            a["pieces"] == b["pieces"] and bool(a["pieces"]))
        d = max((abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])), default=math.nan)
        row(f"chat {s} s: largest logprob difference", "", f"{d:.4f}", None)
    a, b = ls["transcription"][29], co["transcription"][29]
    for k in ("input_tokens", "output_tokens"):
        row(f"transcription 29 s: {k}", a[k], b[k], a[k] == b[k])
    row("transcription 29 s: text", repr(a["text"]), repr(b["text"]), a["text"] == b["text"])
    a, b = ls["transcription"][31], co["transcription"][31]
    row("transcription 31 s: input_tokens (one context vs two windows: not compared)",
        a["input_tokens"], b["input_tokens"], None)
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--json", type=Path, help="write both sides' answers and the table here")
    a = ap.parse_args(argv)
    from corral.store.embedded import embedded_model_path
    from testkit.audio_files import encode, recording
    from testkit.gguf_audio import write_qwen2a_mmproj

    ctx = Ctx(argparse.Namespace(quick=False, model=str(embedded_model_path()), threads=THREADS))
    mmproj = write_qwen2a_mmproj(ctx.tmp / "qwen2a-mmproj.gguf")
    clips = {s: encode(recording(s), "wav") for s in CLIPS_S}
    t0 = time.perf_counter()
    ls_srv, co_srv = _servers(ctx, mmproj)
    try:
        ls = asyncio.run(_side(ls_srv.base_url, clips))
        co = asyncio.run(_side(co_srv.base_url, clips))
    finally:
        co_srv.stop(grace_s=3.0)
        ls_srv.stop(grace_s=3.0)
        stop_all()
    rows, ok = compare(ls, co)
    print(f"qwen2a projector on the embedded Gemma 3 270M; {THREADS} threads, 1 slot, n_batch {N_BATCH}, "
          f"ChatML on both, greedy, max_tokens {MAX_TOKENS}; {time.perf_counter() - t0:.0f} s")
    print("| check | llama-server | corral | verdict |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("audio parity:", "same" if ok else "DIFFERENT")
    if a.json:
        a.json.write_text(json.dumps({"llama-server": ls, "corral": co, "rows": rows, "same": ok}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
