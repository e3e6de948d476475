"""Vision check: corral's worker against llama-server ``--mmproj`` on the same two files.

    .venv/bin/python -m bench.checks.vision            # ~2 min on 2 cores
    .venv/bin/python -m bench.checks.vision --quick    # fewer rounds

The files: the embedded Gemma 3 270M and a Gemma 3 projector for it written offline
(testkit/gguf_vision.py; for the bench 224 px images, patch 14, no pooling: 256
image positions, as many as a real Gemma 3 image). Random weights: the words mean nothing,
every step is real. Images are made with Pillow; each round uses new pictures (no cache hit
on either side). corral is driven at its worker (the process the router starts, over its
socketpair: the engine's side of images is measured here), llama-server over HTTP.

1. Same greedy tokens: a raw prompt with an image, greedy, on both: the texts must match.
2. Image to first token: one request at a time, each with a new image; the median time
   from sending it to its first token, and corral's speed as a ratio (goal >= 0.95). Both
   servers are up, and they take turns (the first of each pair alternates; the other sits
   idle): the machine's drift falls on both alike (until 2026-12-01 all of llama-server's
   rounds ran before corral's, and the ratio of one run swung from 0.79x to 1.24x).
3. Streams beside images: two streams generate (``ignore_eos``) alone, then while a third
   client sends image requests back to back (at most ``MAX_IMAGES_BESIDE``); each side's
   stream token rate with images over its rate alone (goal >= 0.8). A stream's rate is its
   tokens over the time from sending it to its end (a stream kept waiting counts). Every
   image sent beside the streams is a new picture (no cache hit: each is encoded and
   decoded; until 2026-12-01 they cycled through the first-token rounds' pictures, which
   both servers then had cached).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.checks.editors import THREADS, Proc, _free_port
from bench.llama_server import buffer_args, find as find_llama_server
from corral import wire

ROOT = Path(__file__).resolve().parents[2]
N_BATCH = 512
CTX = 4096
N_PARALLEL = 3
PROMPT = f"Picture: {wire.MEDIA_MARKER}\nCaption:"
STREAM_ROUNDS = 2  # alone, beside, alone, beside: medians of each
MAX_IMAGES_BESIDE = 6  # image requests sent while the streams run, at most
STREAM_PROMPT = "Once upon a time, in a small village by the sea,"


def picture(seed: int, size: tuple[int, int] = (320, 240)) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    # smooth colour fields, not noise: closer to a photo, and the same for both servers
    y, x = np.mgrid[0:size[1], 0:size[0]]
    img = np.stack([(np.sin(x / (7 + rng.integers(9))) * 120 + 128), (np.cos(y / (5 + rng.integers(9))) * 120 + 128),
                    ((x + y) * rng.integers(1, 4) % 256)], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    return buf.getvalue()


class Worker:
    """One corral worker process, messages sorted by request id as they arrive (with times)."""

    def __init__(self, model: Path, mmproj: Path) -> None:
        from corral.control.transport.local import LocalSpawner

        settings = wire.WorkerSettings(model_id="m", model_path=str(model), mmproj=str(mmproj), ctx_len=CTX,
                                       n_parallel=N_PARALLEL, n_batch=N_BATCH, threads=THREADS, threads_batch=THREADS)
        os.environ["CORRAL_ADAPTIVE_THREADS"] = "0"  # the same threads as llama-server's, always
        self.log = Path(tempfile.mkdtemp(prefix="corral-vision-")) / "worker.log"
        self._fh = open(self.log, "wb")
        self.proc, self.sock = LocalSpawner(self.log.parent).spawn_process(
            settings, stdout=self._fh, stderr=subprocess.STDOUT,
            env={"PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")})
        self._queues: dict[str, queue.Queue[tuple[float, wire.FromWorker]]] = {}
        self._lock = threading.Lock()
        self._ready: queue.Queue[wire.FromWorker] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        while not isinstance(msg := self._ready.get(timeout=180), wire.Ready):
            if isinstance(msg, wire.LoadFailed):
                raise RuntimeError(f"the worker failed to load: {msg}")

    def _read(self) -> None:
        dec = wire.FrameDecoder()
        while data := self.sock.recv(1 << 16):
            now = time.perf_counter()
            for frame in dec.feed(data):
                msg = wire.decode_from_worker(frame)
                rid = getattr(msg, "id", None)
                if isinstance(rid, str) and isinstance(msg, (wire.Delta, wire.Finished, wire.RequestFailed)):
                    self._queue(rid).put((now, msg))
                else:
                    self._ready.put(msg)

    def _queue(self, rid: str) -> queue.Queue[tuple[float, wire.FromWorker]]:
        with self._lock:
            return self._queues.setdefault(rid, queue.Queue())

    def run(self, req: wire.GenerateRequest) -> tuple[str, float, wire.Finished]:
        """Send ``req``, wait for its end: (text, seconds to the first token, Finished)."""
        q = self._queue(req.id)
        t0 = time.perf_counter()
        self.sock.sendall(wire.encode(req))
        text, first = "", 0.0
        while True:
            t, msg = q.get(timeout=300)
            if isinstance(msg, wire.Delta):
                first = first or t - t0
                text += msg.text
            elif isinstance(msg, wire.Finished):
                return text, first or t - t0, msg
            else:
                raise RuntimeError(f"corral failed {req.id}: {msg}")

    def stop(self) -> None:
        self.sock.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._fh.close()


def corral_image(i: int, img: bytes, n: int) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=f"img{i}", prompt=PROMPT, images=[img],
                                params=wire.SamplingParams(max_tokens=n, temperature=0.0))


def corral_stream(i: int, n: int) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=f"s{i}", prompt=STREAM_PROMPT,
                                params=wire.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))


def ls_image_body(img: bytes, n: int) -> dict[str, Any]:
    return {"prompt": {"prompt_string": PROMPT, "multimodal_data": [base64.b64encode(img).decode()]},
            "n_predict": n, "temperature": 0, "cache_prompt": True}


async def ls_run(c: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[str, float, float]:
    """Stream one /completion: (text, seconds to the first token, tokens a second from sending
    it to its end)."""
    t0 = time.perf_counter()
    text, first, timings = "", 0.0, {}
    async with c.stream("POST", url + "/completion", json={**body, "stream": True}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev.get("content") and not first:
                first = time.perf_counter() - t0
            text += ev.get("content", "")
            timings = ev.get("timings", timings)
    wall = time.perf_counter() - t0
    return text, first or wall, timings.get("predicted_n", 0) / wall


def start_llama_server(model: Path, mmproj: Path) -> Proc:
    exe = find_llama_server()
    if exe is None:
        raise SystemExit("no llama-server (python -m bench.llama_server builds it)")
    port = _free_port()
    os.environ["LLAMA_MEDIA_MARKER"] = wire.MEDIA_MARKER  # llama-server's marker is random otherwise
    p = Proc("llama-server-vision", [str(exe), "-m", str(model), "--mmproj", str(mmproj), "--host", "127.0.0.1",
                                     "--port", str(port), "-np", str(N_PARALLEL), "-c", str(CTX), "-b", str(N_BATCH),
                                     "-ub", str(N_BATCH), "-t", str(THREADS), "-tb", str(THREADS), "-ngl", "0",
                                     *buffer_args()],
             port, "/health")
    try:
        p.wait()
    except BaseException:
        p.stop()
        raise
    return p


def _client() -> httpx.AsyncClient:
    # no keep-alive: llama-server may close an idle connection the pool would reuse
    return httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


def ls_once(url: str, body: dict[str, Any]) -> tuple[str, float, float]:
    """One /completion from this (synchronous) thread: ``ls_run``'s answer."""
    async def one() -> tuple[str, float, float]:
        async with _client() as c:
            return await ls_run(c, url, body)

    return asyncio.run(one())


def first_tokens(ls: Proc, w: Worker, imgs: list[bytes]) -> dict[str, Any]:
    """The greedy texts, and the image-to-first-token rounds with the two servers taking turns
    (which goes first alternates), so the machine's drift falls on both alike; the other
    server sits idle meanwhile."""
    ls_once(ls.url, ls_image_body(imgs[-1], 2))  # warm-ups (the first graphs)
    w.run(corral_image(-1, imgs[-1], 2))
    out: dict[str, Any] = {"ls_greedy": ls_once(ls.url, ls_image_body(imgs[0], 16))[0],
                           "co_greedy": w.run(corral_image(0, imgs[0], 16))[0]}
    ls_t: list[float] = []
    co_t: list[float] = []
    for i, img in enumerate(imgs[1:-1], start=1):
        turns = [lambda: ls_t.append(ls_once(ls.url, ls_image_body(img, 1))[1]),
                 lambda: co_t.append(w.run(corral_image(i, img, 1))[1])]
        for turn in turns if i % 2 else reversed(turns):
            turn()
    out.update(ls_ttft_s=statistics.median(ls_t), co_ttft_s=statistics.median(co_t))
    return out


async def ls_streams(url: str, stream_tokens: int, beside_imgs: list[bytes]) -> dict[str, Any]:
    async with _client() as c:
        s_body = {"prompt": STREAM_PROMPT, "n_predict": stream_tokens, "temperature": 0, "ignore_eos": True,
                  "cache_prompt": False}
        alone: list[float] = []
        beside: list[float] = []
        n_img = 0
        for _ in range(STREAM_ROUNDS):  # alone and beside in turns: the machine's load drifts
            alone += [r for _, _, r in await asyncio.gather(*(ls_run(c, url, s_body) for _ in range(2)))]
            done = asyncio.Event()

            async def images() -> int:
                n = 0
                while not done.is_set() and n < MAX_IMAGES_BESIDE:
                    await ls_run(c, url, ls_image_body(beside_imgs[n_img + n], 1))
                    n += 1
                return n

            sender = asyncio.create_task(images())
            beside += [r for _, _, r in await asyncio.gather(*(ls_run(c, url, s_body) for _ in range(2)))]
            done.set()
            n_img += await sender
    return {"alone_tps": statistics.median(alone), "beside_tps": statistics.median(beside), "images_beside": n_img}


def corral_streams(w: Worker, stream_tokens: int, beside_imgs: list[bytes]) -> dict[str, Any]:
    alone: list[float] = []
    beside: list[float] = []
    sent = [0]
    for r in range(STREAM_ROUNDS):  # alone and beside in turns: the machine's load drifts
        alone += _together(w, [corral_stream(10 * r + i, stream_tokens) for i in (1, 2)])
        done = threading.Event()
        first = sent[0]

        def images() -> None:
            while not done.is_set() and sent[0] - first < MAX_IMAGES_BESIDE:
                w.run(corral_image(100 + sent[0], beside_imgs[sent[0]], 1))
                sent[0] += 1

        sender = threading.Thread(target=images)
        sender.start()
        beside += _together(w, [corral_stream(10 * r + i, stream_tokens) for i in (3, 4)])
        done.set()
        sender.join()
    return {"alone_tps": statistics.median(alone), "beside_tps": statistics.median(beside), "images_beside": sent[0]}


def _together(w: Worker, reqs: list[wire.GenerateRequest]) -> list[float]:
    out: list[float] = [0.0] * len(reqs)

    def one(i: int) -> None:
        t0 = time.perf_counter()
        fin = w.run(reqs[i])[2]
        out[i] = fin.usage.completion_tokens / (time.perf_counter() - t0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 first-token rounds, 32-token streams")
    a = ap.parse_args(argv)
    from corral.store.embedded import embedded_model_path
    from testkit.gguf_vision import image_tokens, write_gemma3_mmproj

    model = embedded_model_path()
    shape = dict(image_size=224, patch_size=14, n_merge=1)
    mmproj = write_gemma3_mmproj(Path(tempfile.mkdtemp(prefix="corral-vision-")) / "mmproj-bench.gguf", **shape)
    rounds, stream_tokens = (5, 32) if a.quick else (15, 96)
    imgs = [picture(s) for s in range(rounds + 2)]  # greedy, the rounds, a warm-up
    beside = [picture(100 + s) for s in range(STREAM_ROUNDS * MAX_IMAGES_BESIDE)]  # new ones, never cached
    print("llama-server and corral ...", file=sys.stderr, flush=True)
    p = start_llama_server(model, mmproj)
    try:
        w = Worker(model, mmproj)
        try:
            first = first_tokens(p, w, imgs)
            ls = asyncio.run(ls_streams(p.url, stream_tokens, beside))
            co = corral_streams(w, stream_tokens, beside)
        finally:
            w.stop()
    finally:
        p.stop()
    print(f"projector: gemma3, {image_tokens(**shape)} positions an image; {THREADS} threads, "
          f"{N_PARALLEL} slots, n_batch {N_BATCH}")
    print("| check | llama-server | corral | ratio (goal) |\n|---|---|---|---|")
    same = first["ls_greedy"] == first["co_greedy"]
    print(f"| greedy text, image + prompt | {first['ls_greedy']!r} | {first['co_greedy']!r} | "
          f"{'same' if same else 'DIFFERENT'} |")
    lt, ct = first["ls_ttft_s"], first["co_ttft_s"]
    print(f"| image to first token (median of {rounds}, in turns) | {lt * 1000:.0f} ms | {ct * 1000:.0f} ms "
          f"| {lt / ct:.2f}x speed (>= 0.95) |")
    def streams(r: dict[str, Any]) -> str:
        return (f"{r['alone_tps']:.1f} -> {r['beside_tps']:.1f} tok/s ({r['images_beside']} images): "
                f"{r['beside_tps'] / r['alone_tps']:.2f}x")

    print(f"| 2 streams alone -> beside an image client | {streams(ls)} | {streams(co)} | "
          f"corral {co['beside_tps'] / co['alone_tps']:.2f}x (>= 0.8) |")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
