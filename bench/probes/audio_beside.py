"""Where the streams' time goes while recordings are heard beside them (``audio`` scenario (a)).

    .venv/bin/python -m bench.probes.audio_beside            # 3 rounds of each mode, interleaved

Two text streams (``ignore_eos``) on the embedded model with the generated Qwen2-Audio
projector (3 slots), alone and beside a client sending 5 s recordings back to back, in
modes taken in turns each round (the machine's load drifts):

- ``same``: the one clip every time (the scenario's (a): each request after the first can
  reuse the slot's cached prefix);
- ``new``: a new clip every request (an encode and a 750-position side decode each);
- ``text``: the same requests with the audio part left out (what a request costs the
  streams without audio: the router, the prompt, one token).

Per mode: the streams' tok/s over alone, the requests sent, the router's and the worker's
CPU seconds while they ran (cores: CPU seconds over the round's wall time).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from corral.store.embedded import embedded_model_path

from bench.context import Ctx, log, start
from bench.scenarios.audio import STREAM_PROMPT, _files, _stream_rate, _varied
from bench.servers import corral_cmd, free_port, proc_cpu_s, stop_all

MODEL = "audio-3"


def _worker_pids(models: dict[str, Any]) -> list[int]:
    return [i["pid"] for m in models["data"] for i in m.get("instances", []) if i.get("pid")]


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / 100  # utime + stime, clock ticks


async def _round(c: httpx.AsyncClient, clips: list[str] | None, n_tokens: int) -> tuple[float, int]:
    stop = asyncio.Event()

    async def hear() -> int:
        k = 0
        while not stop.is_set():
            content: list[dict[str, Any]] = [{"type": "text", "text": "What is said?"}]
            if clips is not None:
                content.insert(0, {"type": "input_audio", "input_audio": {"data": clips[k % len(clips)]}})
            r = await c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1, "messages": [
                {"role": "user", "content": content}]})
            r.raise_for_status()
            k += 1
        return k

    task = asyncio.create_task(hear())
    rates = await asyncio.gather(*(_stream_rate(c, MODEL, n_tokens) for _ in range(2)))
    stop.set()
    return statistics.median(rates), await task


async def main(args: argparse.Namespace) -> None:
    ctx = Ctx(argparse.Namespace(quick=False, model=str(embedded_model_path()), threads=2))
    mmproj, encode, recording = _files(ctx)
    models = {MODEL: ctx.corral_model(3, mmproj=str(mmproj), ctx_len=3 * 2048)}
    cfg = ctx.corral_config("audio-beside", models, max_audio_s=3600.0)
    port = free_port()
    srv = start("corral-audio-beside", corral_cmd(cfg, port), port)
    same = [base64.b64encode(encode(recording(5), "wav")).decode()]
    fresh = [base64.b64encode(encode(_varied(5, 100 + i), "wav")).decode() for i in range(400)]
    modes: dict[str, list[str] | None] = {m: v for m, v in {"same": same, "new": fresh, "text": None}.items()
                                          if m in args.modes.split(",")}
    out: dict[str, dict[str, list[float]]] = {m: {"ratio": [], "sent": [], "router_cpu": [], "worker_cpu": []}
           for m in modes}
    try:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=600) as c:
            await _stream_rate(c, MODEL, 4)  # loads the model
            [wpid] = _worker_pids((await c.get("/models")).json())
            for r in range(args.rounds):
                for mode, clips in modes.items():
                    alone = statistics.median(await asyncio.gather(
                        *(_stream_rate(c, MODEL, args.tokens) for _ in range(2))))
                    r0, w0 = proc_cpu_s(srv.pid or 0) or 0.0, _cpu(wpid)
                    t0 = time.perf_counter()
                    perf = (subprocess.Popen(["perf", "record", "-F", "999", "-g", "-p", str(wpid), "-o",
                                              f"{args.perf}/{mode}-{r}.data"], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL) if args.perf else
                            subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-r", "200",
                                              "--threads", "-f", "raw", "-o", f"{args.py_spy}/{mode}-{r}.txt",
                                              "-p", str(wpid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            if args.py_spy else None)
                    beside, sent = await _round(c, clips, args.tokens)
                    wall = time.perf_counter() - t0
                    if perf is not None:
                        perf.send_signal(signal.SIGINT)
                        perf.wait()
                    r1, w1 = proc_cpu_s(srv.pid or 0) or 0.0, _cpu(wpid)
                    o = out[mode]
                    o["ratio"].append(beside / alone)
                    o["sent"].append(sent)
                    o["router_cpu"].append((r1 - r0) / wall)
                    o["worker_cpu"].append((w1 - w0) / wall)
                    log(f"round {r} {mode}: alone {alone:.1f} beside {beside:.1f} tok/s ({beside / alone:.2f}x), "
                        f"{sent} sent, router {(r1 - r0) / wall:.2f} cores, worker {(w1 - w0) / wall:.2f} cores")
    finally:
        stop_all()
    print("| mode | beside / alone (median) | requests sent | router cores | worker cores |")
    print("|---|---|---|---|---|")
    for mode, o in out.items():
        print(f"| {mode} | {statistics.median(o['ratio']):.2f}x ({', '.join(f'{x:.2f}' for x in o['ratio'])}) | "
              f"{statistics.median(o['sent']):.0f} | {statistics.median(o['router_cpu']):.2f} | "
              f"{statistics.median(o['worker_cpu']):.2f} |")
    print(json.dumps({"prompt": STREAM_PROMPT, "tokens": args.tokens, "rounds": args.rounds}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.probes.audio_beside")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--modes", default="same,new,text")
    ap.add_argument("--perf", metavar="DIR", help="perf record the worker during each round beside, into DIR")
    ap.add_argument("--py-spy", metavar="DIR", help="py-spy record (raw, by thread) the worker during each round "
                                                    "beside, into DIR (the venv needs py-spy)")
    asyncio.run(main(ap.parse_args()))
