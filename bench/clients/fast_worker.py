"""A worker that streams as fast as the wire allows, for the router's ceiling (bench/scenarios/router_ceiling.py).

Speaks ``corral.wire`` like ``python -m corral.worker`` (spawned by the router or by
``wire_driver.DirectWorker`` with ``--fd N --settings JSON``), with no model: every
generation yields ``max_tokens`` one-character tokens at once. The settings' ``model_path``
names a JSON file whose ``mode`` says how:

    step   one token a slot per step, the step's frames in one write, as the real worker
           sends them (``worker/process.py``): a step is every running request's next Delta
           (and the Finished of those done); the next step once the socket has taken it
    burst  each request's whole answer (its Deltas, then Finished) in one write as soon as it
           arrives: as fast as it can

``step_s`` (step mode): a step at most every that many seconds, as a model's step time (0:
as fast as the socket takes them); ``spread``: a generation ends up to that many tokens before
its ``max_tokens`` (drawn at random), so that answers of a closed loop do not all end in the same
step and their clients do not all come back at once.

Abort ends a request with Finished(abort); StatsRequest is answered; Shutdown exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import time

import msgspec

from corral import wire

_TIMINGS = wire.Timings(0.1, 0.1, 1000.0, 1000.0)


class FastWorker:
    def __init__(self, s: wire.WorkerSettings, mode: str, writer: asyncio.StreamWriter, step_s: float = 0.0,
                 spread: int = 0) -> None:
        self.s, self.mode, self.w, self.step_s, self.spread = s, mode, writer, step_s, spread
        self.running: dict[str, list[int]] = {}  # id -> [tokens sent, tokens asked, prompt tokens]
        self.wake = asyncio.Event()
        self.generated = 0

    def handle(self, msg: wire.ToWorker) -> bool:
        if isinstance(msg, wire.GenerateRequest):
            n = msg.params.max_tokens if msg.params.max_tokens is not None else 16
            n = max(1, n - random.randint(0, self.spread)) if self.spread else n
            prompt = len((msg.prompt or "").split()) or 1
            if self.mode == "burst":
                out = [wire.encode(wire.Delta(msg.id, "x", 1)) for _ in range(n)]
                out.append(wire.encode(wire.Finished(msg.id, "length", wire.Usage(prompt, n), _TIMINGS)))
                self.w.write(b"".join(out))
                self.generated += n
            else:
                self.running[msg.id] = [0, n, prompt]
                self.wake.set()
        elif isinstance(msg, wire.Abort):
            got = self.running.pop(msg.id, None)
            if got is not None:
                self.w.write(wire.encode(wire.Finished(msg.id, "abort", wire.Usage(got[2], got[0]), _TIMINGS)))
        elif isinstance(msg, wire.StatsRequest):
            self.w.write(wire.encode(wire.Stats(slots_busy=len(self.running), slots_total=self.s.slots_asked() or 1,
                                                waiting=0, rss_bytes=0, model_bytes=0, kv_bytes=0,
                                                tokens_generated=self.generated, tokens_prompt=0)))
        elif isinstance(msg, wire.Shutdown):
            return False
        return True

    async def steps(self) -> None:
        """``step`` mode: one Delta a running request per step, a step a write."""
        while True:
            if not self.running:
                self.wake.clear()
                await self.wake.wait()
            t0 = time.perf_counter()
            out = []
            for rid, st in list(self.running.items()):
                out.append(wire.encode(wire.Delta(rid, "x", 1)))
                st[0] += 1
                if st[0] >= st[1]:
                    out.append(wire.encode(wire.Finished(rid, "length", wire.Usage(st[2], st[0]), _TIMINGS)))
                    del self.running[rid]
            self.generated += len(out)
            self.w.write(b"".join(out))
            await self.w.drain()
            # new requests and aborts join the next step
            await asyncio.sleep(max(0.0, self.step_s - (time.perf_counter() - t0)))


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--settings", required=True)
    args = ap.parse_args()
    s = msgspec.json.decode(args.settings, type=wire.WorkerSettings)
    with open(s.model_path) as f:
        script = json.load(f)
    mode = script.get("mode", "step")
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=args.fd))
    n = s.slots_asked() or 1
    w = FastWorker(s, mode, writer, float(script.get("step_s", 0.0)), int(script.get("spread", 0)))
    w.w.write(wire.encode(wire.Loading(os.getpid())))
    info = wire.ModelInfo(description=f"fast worker ({mode})", n_params=1, n_vocab=10, n_ctx_train=s.ctx_len,
                          n_ctx=s.ctx_len, n_ctx_slot=s.ctx_len // n, n_slots=n, n_embd=4, embedding=False,
                          has_chat_template=False, model_bytes=0, kv_bytes=0, rss_bytes=0, gpu_layers=0, load_ms=0.0)
    w.w.write(wire.encode(wire.Ready(os.getpid(), info)))
    stepper = asyncio.create_task(w.steps()) if mode == "step" else None
    dec = wire.FrameDecoder()
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return 0
            for body in dec.feed(data):
                if not w.handle(wire.decode_to_worker(body)):
                    await writer.drain()
                    return 0
            if mode == "burst":
                await writer.drain()
    finally:
        if stepper is not None:
            stepper.cancel()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
