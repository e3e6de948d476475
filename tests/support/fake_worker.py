"""A fake worker: speaks corral.wire like ``python -m corral.worker`` but plays a script.

Run as ``python tests/support/fake_worker.py --fd N --settings JSON``. The settings'
``model_path`` names a JSON script (missing keys take the defaults below):

    load_delay_s     seconds before Ready                      (0)
    load_fail        a reason: send LoadFailed and exit 1        (null)
    exit_on_load     exit with this code while loading           (null)
    tokens           the text pieces every generation yields     (["Hello", ",", " world", "!"])
    token_delay_s    seconds between pieces                      (0)
    model_bytes, kv_bytes, rss_bytes                             (1000, 100, 5000)
    embedding_dim                                                (4)
    stderr           lines printed to stderr at start            ([])
    shutdown_delay_s seconds between Shutdown and exiting          (0)
    protocol         the wire protocol version it claims in Loading (wire.PROTOCOL_VERSION)
    device_bytes     report a GPU fit plan with this many bytes on its first GPU   (null: no plan)
                     (a list: that many bytes on each GPU it sees, in order)

``--list-devices`` prints the devices of the test hook CORRAL_FAKE_DEVICES (else none),
like ``python -m corral.worker --list-devices``; Ready reports them too.

A prompt containing "TOOLONG" fails with context_length_exceeded; "SLOW" waits ``slow_delay_s`` (default 0.2) between pieces, one
containing "FOREVER" streams until aborted; "BOOM" makes it exit with code 7.
Preempt pauses a generation before its next piece (answered by Paused, kept_kv true);
Resume continues it; Abort of a paused one ends it with Finished(abort). A prompt
containing "NOPAUSE" is never paused (Paused with paused false).
A model given an ``mmproj`` reports ``vision`` (it sees images; the images reach it as bytes).
A TokenizeRequest is answered at once, with a token per word (a chat: its contents).
Every request it receives is appended to ``<script>.log`` (one JSON line), and the
settings of its last spawn are in ``<script>.settings``, so tests can see what reached the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

import msgspec  # noqa: E402

from corral import wire  # noqa: E402

DEFAULTS = {
    "load_delay_s": 0.0,
    "load_fail": None,
    "exit_on_load": None,
    "tokens": ["Hello", ",", " world", "!"],
    "token_delay_s": 0.0,
    "slow_delay_s": 0.2,
    "model_bytes": 1000,
    "kv_bytes": 100,
    "rss_bytes": 5000,
    "embedding_dim": 4,
    "stderr": [],
    "shutdown_delay_s": 0.0,
    "protocol": wire.PROTOCOL_VERSION,
    "device_bytes": None,
}


def fake_devices() -> list[wire.DeviceInfo]:
    if not os.environ.get("CORRAL_FAKE_DEVICES"):
        return []
    from corral.worker.host.devices import list_devices

    return list_devices()


class Fake:
    def __init__(self, settings: wire.WorkerSettings, script: dict, writer: asyncio.StreamWriter,
                 log_path: str) -> None:
        self.s = settings
        self.script = script
        self.w = writer
        self.tasks: dict[str, asyncio.Task] = {}
        self.log_path = log_path
        self.generated = 0
        self.pausing: set[str] = set()  # Preempt received, not yet paused
        self.resumes: dict[str, asyncio.Event] = {}  # paused: set on Resume
        self.texts: dict[str, str] = {}  # each running request's prompt

    def send(self, msg) -> None:
        self.w.write(wire.encode(msg))

    def record(self, msg) -> None:
        with open(self.log_path, "a") as f:
            f.write(msgspec.json.encode(msg).decode() + "\n")

    async def generate(self, req: wire.GenerateRequest) -> None:
        text = req.prompt or " ".join(m.content for m in req.messages or [])
        if "BOOM" in text:
            os._exit(7)
        if "TOOLONG" in text:
            self.send(wire.RequestFailed(req.id, "context_length_exceeded",
                                         "the prompt has 9999 tokens; a slot holds 1024"))
            self.tasks.pop(req.id, None)
            return
        delay = self.script["slow_delay_s"] if "SLOW" in text else self.script["token_delay_s"]
        pieces = list(self.script["tokens"])
        forever = "FOREVER" in text
        limit = req.params.max_tokens
        n_prompt = len(text.split()) or 1
        if req.token_budget is not None:  # as the engine: the prompt must fit, then it bounds the rest
            if n_prompt > req.token_budget:
                self.send(wire.RequestFailed(req.id, "over_token_budget", f"the prompt has {n_prompt} tokens"))
                self.tasks.pop(req.id, None)
                return
            limit = min(limit if limit is not None else n_prompt + req.token_budget, req.token_budget - n_prompt)
        n = 0
        reason = "stop"
        t0 = time.perf_counter()
        try:
            i = 0
            while forever or i < len(pieces):
                if limit is not None and n >= limit:
                    reason = "length"
                    break
                await asyncio.sleep(delay)  # also yields: Abort must get through
                if req.id in self.pausing:
                    self.pausing.discard(req.id)
                    ev = self.resumes[req.id] = asyncio.Event()
                    self.send(wire.Paused(id=req.id, paused=True, kept_kv=True, n_tokens=n))
                    await ev.wait()
                    del self.resumes[req.id]
                self.send(wire.Delta(req.id, pieces[i % len(pieces)], 1))
                if forever:
                    await self.w.drain()
                n += 1
                i += 1
                self.generated += 1
        except asyncio.CancelledError:
            reason = "abort"
        ms = (time.perf_counter() - t0) * 1000
        self.send(wire.Finished(req.id, reason, wire.Usage(n_prompt, n),
                                wire.Timings(1.0, ms, 1000.0, n / max(ms, 1e-3) * 1000)))
        self.tasks.pop(req.id, None)

    def aborted_early(self, task: asyncio.Task, rid: str) -> None:
        """An Abort that came before the generation began (in the same read): answer it
        as the real worker answers an aborted queued request."""
        if task.cancelled():
            self.send(wire.Finished(rid, "abort", wire.Usage(1, 0), wire.Timings(0.0, 0.0, 0.0, 0.0)))
            self.tasks.pop(rid, None)

    def handle(self, msg) -> bool:
        if isinstance(msg, wire.GenerateRequest):
            self.record(msg)
            self.texts[msg.id] = msg.prompt or " ".join(m.content for m in msg.messages or [])
            self.tasks[msg.id] = asyncio.get_running_loop().create_task(self.generate(msg))
        elif isinstance(msg, wire.EmbedRequest):
            self.record(msg)
            if not self.s.embedding:
                self.send(wire.RequestFailed(msg.id, "invalid_request",
                                             "this model was not loaded for embeddings"))
            else:
                dim = self.script["embedding_dim"]
                data = [[float(len(t) + k) for k in range(dim)] for t in msg.inputs]
                self.send(wire.Embeddings(msg.id, data, sum(len(t.split()) for t in msg.inputs)))
        elif isinstance(msg, wire.TokenizeRequest):  # a chat renders as its contents; a word is a token
            self.record(msg)
            text = msg.text if msg.text is not None else " ".join(m.content for m in msg.messages or [])
            words = text.split() if msg.tokens is None else [str(t) for t in msg.tokens]
            self.send(wire.Tokenized(msg.id, list(range(len(words))), [w.encode() for w in words], text))
        elif isinstance(msg, wire.Abort):
            self.record(msg)
            t = self.tasks.get(msg.id)
            if t is not None:
                t.cancel()
                t.add_done_callback(lambda t, rid=msg.id: self.aborted_early(t, rid))
        elif isinstance(msg, wire.Preempt):
            self.record(msg)
            if msg.id in self.tasks and msg.id not in self.resumes and "NOPAUSE" not in self.texts.get(msg.id, ""):
                self.pausing.add(msg.id)
            else:
                self.send(wire.Paused(id=msg.id, paused=False))
        elif isinstance(msg, wire.Resume):
            self.record(msg)
            if msg.id in self.resumes:
                self.resumes[msg.id].set()
        elif isinstance(msg, wire.StatsRequest):
            sc = self.script
            self.send(wire.Stats(slots_busy=len(self.tasks), slots_total=self.s.n_parallel, waiting=0,
                                 rss_bytes=sc["rss_bytes"], model_bytes=sc["model_bytes"],
                                 kv_bytes=sc["kv_bytes"], tokens_generated=self.generated,
                                 tokens_prompt=0))
        elif isinstance(msg, wire.SlotFileAction):
            self.record(msg)
            self.send(self.slot_file(msg))
        elif isinstance(msg, wire.Shutdown):
            return False
        return True

    def slot_file(self, msg: wire.SlotFileAction) -> wire.SlotFileDone:
        """Slot files as the real worker answers them: "FAKESLOT" + the slot index, 3 tokens."""
        done = {"id": msg.id, "action": msg.action, "slot": msg.slot}
        if msg.slot >= self.s.n_parallel:
            return wire.SlotFileDone(**done, error="invalid_slot", message="Invalid slot ID")
        if msg.action == "erase":
            return wire.SlotFileDone(**done, n_tokens=3)
        path = os.path.join(msg.directory, msg.filename)
        if msg.action == "save":
            os.makedirs(msg.directory, exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"FAKESLOT%d" % msg.slot)
            return wire.SlotFileDone(**done, n_tokens=3, n_bytes=9, ms=1.5)
        if not os.path.exists(path):
            return wire.SlotFileDone(**done, error="invalid_file", message="Unable to restore slot: no such slot file")
        return wire.SlotFileDone(**done, n_tokens=3, n_bytes=os.path.getsize(path), ms=0.5)


async def main() -> int:
    if sys.argv[1:] == ["--list-devices"]:  # FAKE_PROBE_SEES_NOTHING: as if the probe saw no GPU
        print(msgspec.json.encode([] if os.environ.get("FAKE_PROBE_SEES_NOTHING") else fake_devices()).decode())
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--settings", required=True)
    args = ap.parse_args()
    settings = msgspec.json.decode(args.settings, type=wire.WorkerSettings)
    if settings.slots_asked() is None:  # n_parallel = "auto": a worker plans its slots; this one takes 4
        settings = msgspec.structs.replace(settings, n_parallel=4, ctx_len=4 * settings.slot_ctx())
    with open(settings.model_path + ".settings", "w") as f:  # what the router sent, for tests
        f.write(args.settings)
    script = dict(DEFAULTS)
    with open(settings.model_path) as f:
        script.update(json.load(f))
    for line in script["stderr"]:
        print(line, file=sys.stderr, flush=True)
    sock = socket.socket(fileno=args.fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    fake = Fake(settings, script, writer, settings.model_path + ".log")
    fake.send(wire.Loading(os.getpid(), script["protocol"]))
    if script["load_delay_s"]:
        await asyncio.sleep(script["load_delay_s"])
    if script["exit_on_load"] is not None:
        os._exit(script["exit_on_load"])
    if script["load_fail"]:
        fake.send(wire.LoadFailed(script["load_fail"]))
        await writer.drain()
        return 1
    devices = fake_devices()
    gpus = [d for d in devices if d.kind == "gpu"]
    fit = None
    if script["device_bytes"] is not None and gpus:
        split = script["device_bytes"]  # a list: bytes on each GPU it sees
        shares = [wire.DevicePlan(index=k, name=g.name, bytes=b, free_bytes=g.free_bytes)
                  for k, (g, b) in enumerate(zip(gpus, split))] if isinstance(split, list) else []
        fit = wire.FitPlan(n_gpu_layers=1, n_layers=1, ctx_len=settings.ctx_len, ctx_len_asked=settings.ctx_len,
                           device=",".join(d.name for d in shares) or gpus[0].name,
                           device_bytes=sum(d.bytes for d in shares) if shares else split,
                           host_bytes=script["model_bytes"], free_bytes=gpus[0].free_bytes, margin_bytes=0,
                           notes="fake", devices=shares)
    info = wire.ModelInfo(
        description="fake", n_params=1, n_vocab=10, n_ctx_train=settings.ctx_len,
        n_ctx=settings.ctx_len, n_ctx_slot=settings.ctx_len // settings.n_parallel,
        n_slots=settings.n_parallel, n_embd=script["embedding_dim"], embedding=settings.embedding,
        has_chat_template=False, model_bytes=script["model_bytes"], kv_bytes=script["kv_bytes"],
        rss_bytes=script["rss_bytes"], gpu_layers=0, load_ms=1.0, devices=devices, fit=fit,
        vision=bool(settings.mmproj))  # as if it loaded the projector it was given
    fake.send(wire.Ready(os.getpid(), info))
    dec = wire.FrameDecoder()
    while True:
        data = await reader.read(65536)
        if not data:
            return 0
        for body in dec.feed(data):
            if not fake.handle(wire.decode_to_worker(body)):
                await writer.drain()
                if script["shutdown_delay_s"]:
                    await asyncio.sleep(script["shutdown_delay_s"])
                return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
