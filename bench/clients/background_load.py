"""A closed-loop streaming load in a process of its own, so that the client whose latency
is measured (the fairness scenario's light key) does not share an event loop, and a GIL,
with the load's streams: 16 heavy SSE streams parsed in the timer's process delay the
moment it reads its own first chunk.

    proc = BackgroundLoad.start(url, secret, concurrency=16, max_tokens=32, first_index=100_000, model="bench")
    ...                      # measure something else meanwhile
    summary = proc.stop()    # {"requests": N, "completed": N, "completion_tokens": N, "errors": N,
                             #  "refused": N, "wall_s": S}

The child (``python -m bench.clients.background_load``, JSON settings on argv) runs
``concurrency`` clients, each sending one request after another, until its stdin closes;
then it cuts the running requests (their streamed tokens count) and prints the summary as
one JSON line: ``completed`` ended with their answer, ``errors`` failed (of them ``refused``:
a 503, e.g. a queue wait that timed out), the rest were cut at the stop. The wall time is the child's own, from its first request to the stop.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.clients.loadgen import RequestResult, completion_body, one_request


@dataclass
class BackgroundLoad:
    proc: subprocess.Popen[str]

    @classmethod
    def start(cls, url: str, secret: str | None, *, concurrency: int, max_tokens: int, first_index: int,
              model: str | None) -> "BackgroundLoad":
        settings = {"url": url, "secret": secret, "concurrency": concurrency, "max_tokens": max_tokens,
                    "first_index": first_index, "model": model}
        proc = subprocess.Popen([sys.executable, "-m", "bench.clients.background_load", json.dumps(settings)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "started": its clients are sending
        if not line.startswith("started"):
            proc.kill()
            raise RuntimeError(f"background load did not start: {line!r}")
        return cls(proc)

    def stop(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """End the load (stdin closes) and return its summary."""
        out, _ = self.proc.communicate(timeout=timeout_s)
        return dict(json.loads(out.strip().splitlines()[-1]))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def _run(s: dict[str, Any]) -> dict[str, Any]:
    n = int(s["concurrency"])
    headers = {"Authorization": f"Bearer {s['secret']}"} if s.get("secret") else {}
    client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600, connect=30),
                               limits=httpx.Limits(max_connections=n + 2, max_keepalive_connections=n + 2))
    stop = asyncio.Event()
    results: list[RequestResult] = []
    counter = iter(range(int(s["first_index"]), 10**9))

    async def worker() -> None:
        while not stop.is_set():
            res = RequestResult(ok=False)
            results.append(res)
            body = completion_body(s.get("model"), next(counter), int(s["max_tokens"]))
            await one_request(client, s["url"], body, 600, res)

    loop = asyncio.get_running_loop()
    closed = loop.create_future()

    def watch_stdin() -> None:  # a thread: blocks until the parent closes our stdin
        sys.stdin.read()
        loop.call_soon_threadsafe(lambda: closed.done() or closed.set_result(None))

    t0 = time.perf_counter()
    workers = [asyncio.ensure_future(worker()) for _ in range(n)]
    print("started", flush=True)
    await asyncio.gather(asyncio.to_thread(watch_stdin), closed)
    stop.set()
    wall = time.perf_counter() - t0
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    await client.aclose()
    return {"requests": len(results), "completed": sum(r.ok for r in results),
            "completion_tokens": sum(r.completion_tokens for r in results),
            "errors": sum(r.error is not None for r in results),
            "refused": sum(r.status == 503 for r in results), "wall_s": wall}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_run(json.loads(sys.argv[1])))), flush=True)
