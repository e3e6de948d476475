"""Scenario ``audio``: speech on the embedded Gemma 3 270M with a generated Qwen2-Audio
projector (testkit/gguf_audio.py: 750 positions a 30 s window; random weights, so the words
mean nothing and every answer runs to its ``max_tokens``). Recordings are tone bursts with
pauses (testkit/audio_files.py).

(a) **Streams beside audio**: two text streams (``ignore_eos``) alone, then while a third
    client sends 5 s recordings in chat ``input_audio`` parts back to back; the streams'
    tok/s beside audio over alone (goal >= 0.9x, as images).
(b) **A long recording, windows side by side**: ``/v1/audio/transcriptions`` of one
    recording (10 minutes; 2 with ``--quick``) on a model with 4 slots (its windows side by
    side) against the same model with 1 slot (one window after another, as llama-server
    transcribes in one context); the time to the whole transcript and the ratio (goal
    >= 2.5x). What bounds it: the windows' prompts (750 positions each) are compute-bound
    on the same cores either way; side by side gains the batched generation and the
    overlap of one window's encode with another's decode.
(c) **First token of a 30 s clip**: a streamed chat with one 30 s ``input_audio`` part,
    the median time to its first token over 3 rounds, corral against llama-server
    ``--mmproj`` on the same files (``llama_mmproj_cmd``, also bench/checks/audio.py's;
    llama-server only where it was built), both up and taking turns, a new clip every
    request (no prompt-cache hit). 30.0 s is two libmtmd windows, 1,500 positions, on both.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench.context import TURN_GAP_S, Ctx, log, start
from bench.report import Table, ratio
from bench.servers import Server, corral_cmd, free_port, llama_server_cmd

STREAM_PROMPT = "Once upon a time, in a small village by the sea,"
WINDOW_TOKENS = 64  # each window's answer in (b): about what 30 s of speech transcribe to


def _files(ctx: Ctx) -> tuple[Path, Any, Any]:
    from testkit.audio_files import encode, recording
    from testkit.gguf_audio import write_qwen2a_mmproj

    mmproj = write_qwen2a_mmproj(ctx.tmp / "qwen2a-mmproj.gguf")
    return mmproj, encode, recording


def llama_mmproj_cmd(binary: str | Path, model: str, mmproj: Path, port: int, *, threads: int, ctx: int) -> list[str]:
    """llama-server on ``model`` with the projector ``mmproj``, one slot of ``ctx`` cells."""
    return llama_server_cmd(binary, model, port, n_parallel=1, slot_ctx=ctx, threads=threads) + [
        "--mmproj", str(mmproj)]


async def _stream_rate(client: httpx.AsyncClient, model: str, n: int) -> float:
    """One stream's tokens over its whole time (sent to its end)."""
    t0 = time.perf_counter()
    body = {"model": model, "prompt": STREAM_PROMPT, "max_tokens": n, "ignore_eos": True, "temperature": 0,
            "stream": True}
    count = 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                if json.loads(line[6:])["choices"][0].get("text"):
                    count += 1
    return count / (time.perf_counter() - t0)


async def _beside(srv: Server, model: str, clip_b64: str, n_tokens: int, rounds: int) -> tuple[float, float, int]:
    """(streams' tok/s alone, beside audio, audio requests sent beside them)."""
    alone: list[float] = []
    beside: list[float] = []
    sent = 0
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=600) as c:
        for _ in range(rounds):
            alone += await asyncio.gather(*(_stream_rate(c, model, n_tokens) for _ in range(2)))
            stop = asyncio.Event()

            async def hear() -> int:
                k = 0
                while not stop.is_set():
                    r = await c.post("/v1/chat/completions", json={"model": model, "max_tokens": 1, "messages": [
                        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": clip_b64}},
                                                     {"type": "text", "text": "What is said?"}]}]})
                    r.raise_for_status()
                    k += 1
                return k

            task = asyncio.create_task(hear())
            beside += await asyncio.gather(*(_stream_rate(c, model, n_tokens) for _ in range(2)))
            stop.set()
            sent += await task
    return statistics.median(alone), statistics.median(beside), sent


def _varied(seconds: int, seed: int) -> Any:
    """Tone bursts with pauses, a new pitch and loudness every second (``seed``'s): no two
    30 s windows alike, so no window is a prefix another can reuse."""
    import numpy as np

    rate = 16000
    rng = np.random.default_rng(seed)
    t = np.arange(rate) / rate
    parts = [np.sin(2 * np.pi * rng.uniform(150, 2000) * t) * rng.uniform(2000, 9000) * (t < rng.uniform(0.5, 0.9))
             for _ in range(seconds)]
    return np.concatenate(parts).astype(np.int16)


async def _transcribe(srv: Server, model: str, data: bytes, name: str = "long.flac") -> tuple[float, int]:
    async with httpx.AsyncClient(base_url=srv.base_url, timeout=1800) as c:
        t0 = time.perf_counter()
        r = await c.post("/v1/audio/transcriptions", files={"file": (name, data)},
                         data={"model": model, "response_format": "verbose_json",
                               "max_tokens": str(WINDOW_TOKENS)})
        if r.status_code != 200:
            raise RuntimeError(f"transcription: HTTP {r.status_code}: {r.text[:300]}")
        return time.perf_counter() - t0, len(r.json()["segments"])


def clips30(encode: Any, recording: Any, n: int) -> list[str]:
    """``n`` different 30 s clips (base64 WAV): each at its own loudness, so no server finds one
    in its prompt cache."""
    return [base64.b64encode(encode((recording(30) * (1 - 0.04 * k)).astype("int16"), "wav")).decode()
            for k in range(n)]


async def _first_token(base_url: str, model: str, clips: list[str]) -> float:
    """The median time to the first token of a streamed chat, one request a clip (ms)."""
    out = []
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as c:
        for clip_b64 in clips:
            body = {"model": model, "max_tokens": 2, "temperature": 0, "stream": True, "messages": [
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": clip_b64, "format": "wav"}},
                                             {"type": "text", "text": "What is said?"}]}]}
            t0 = time.perf_counter()
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and '"content":"' in line.replace(" ", "") \
                            and '"content":""' not in line.replace(" ", ""):
                        out.append(time.perf_counter() - t0)
                        break
    return statistics.median(out) * 1000 if out else float("nan")


async def _first_tokens(ctx: Ctx, corral: Server, mmproj: Path, clips: list[str]) -> tuple[float, float | None]:
    """(c): corral's and llama-server's median first token (ms; llama-server's None where it is
    not built), both up and taking turns (which goes first alternates, a pause before each
    turn), so the machine's drift falls on both alike; a new clip every request."""
    rounds = (len(clips) - 1) // 2
    if ctx.llama_bin is None:
        return await _first_token(corral.base_url, "audio-1", clips[:rounds]), None
    port = free_port()
    ls = start("llama-server-audio", llama_mmproj_cmd(ctx.llama_bin, ctx.model, mmproj, port,
                                                     threads=ctx.threads, ctx=2048), port)
    ours: list[float] = []
    theirs: list[float] = []
    try:
        await _first_token(ls.base_url, "m", clips[-1:])  # its first graphs: not timed
        for i in range(rounds):
            turns = [(corral.base_url, "audio-1", ours, clips[2 * i]), (ls.base_url, "m", theirs, clips[2 * i + 1])]
            for url, model, out, clip in turns if i % 2 == 0 else reversed(turns):
                await asyncio.sleep(TURN_GAP_S)
                out.append(await _first_token(url, model, [clip]))
    finally:
        ls.stop()
    return statistics.median(ours), statistics.median(theirs)


async def sc_audio(ctx: Ctx) -> list[Table]:
    if "corral" not in ctx.args.servers:
        return []
    mmproj, encode, recording = _files(ctx)
    minutes = ctx.n(10, 2)
    models = {"audio-4": ctx.corral_model(4, mmproj=str(mmproj), ctx_len=4 * 2048),
              "audio-1": ctx.corral_model(1, mmproj=str(mmproj), ctx_len=2048),
              "audio-3": ctx.corral_model(3, mmproj=str(mmproj), ctx_len=3 * 2048)}
    cfg = ctx.corral_config("audio", models, max_loaded_models=1, max_audio_s=3600.0)
    port = free_port()
    srv = start("corral-audio", corral_cmd(cfg, port), port)
    a = Table("Audio (a): two text streams' tok/s beside 5 s recordings (chat input_audio) against alone",
              ["server", "streams alone tok/s", "beside audio tok/s", "ratio", "audio requests beside"])
    b = Table(f"Audio (b): /v1/audio/transcriptions of a {minutes}-minute recording: windows side by side "
              "(4 slots) against one after another (1 slot)",
              ["server", "slots", "windows", "seconds to the transcript", "speed-up"])
    c = Table("Audio (c): first token of a 30 s clip (streamed chat, input_audio), median of 3",
              ["server", "first token ms", "vs llama-server"])
    try:
        clip5 = base64.b64encode(encode(recording(5), "wav")).decode()
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=600) as warm:
            await _stream_rate(warm, "audio-3", 4)  # loads the model: not timed
        log("audio (a): streams alone and beside recordings")
        alone, beside, sent = await _beside(srv, "audio-3", clip5, ctx.n(96, 48), ctx.n(2, 1))
        a.rows.append(["corral", f"{alone:.1f}", f"{beside:.1f}", ratio(beside, alone), str(sent)])
        # every window its own sound and each run its own recording: with the same audio in
        # every window (testkit's recording repeats each second), one slot reuses the window
        # before it as a cached prefix and skips its prefill, and the prompt cache, which
        # survives the swap between the two models, would hand the second run the first's
        times: dict[int, float] = {}
        windows: dict[int, int] = {}
        for k, (slots, mid) in enumerate(((4, "audio-4"), (1, "audio-1"))):
            await _transcribe(srv, mid, encode(recording(1), "wav"), "warm.wav")  # loads the model: not timed
            log(f"audio (b): {minutes} min on {slots} slot(s)")
            times[slots], windows[slots] = await _transcribe(srv, mid, encode(_varied(minutes * 60, k), "flac"))
        for slots in (4, 1):
            b.rows.append(["corral", str(slots), str(windows[slots]), f"{times[slots]:.1f}",
                           ratio(times[1], times[slots])])
        log("audio (c): first token of a 30 s clip")
        rounds = 3
        ours, theirs = await _first_tokens(ctx, srv, mmproj, clips30(encode, recording, 2 * rounds + 1))
    finally:
        srv.stop()
    c.rows.append(["corral", f"{ours:.0f}", "llama-server not run" if theirs is None else ratio(theirs, ours)])
    if theirs is None:
        c.notes.append(f"llama-server: {ctx.llama_bin_error}; not run")
    else:
        c.rows.append(["llama-server", f"{theirs:.0f}", "1.00x"])
        c.notes.append(f"the same files, one slot of 2048 cells, both up and warm, {rounds} rounds in turns, a new "
                       "clip every request (no prompt-cache hit); 30.0 s is 1,500 positions on both (libmtmd's "
                       "window holds 30 s less 10 ms); llama-server renders ChatML, corral its plain prompt (a "
                       "few text tokens apart); the ratio is llama-server's time over corral's (above 1: corral "
                       "is faster)")
    b.notes.append(f"{WINDOW_TOKENS} tokens a window (random weights: every window runs to it); "
                   f"{ctx.threads} threads; the ratio is bounded by the cores the windows' 750-position "
                   "prompts share either way")
    return [a, b, c]
