"""Slow clients against a real router: header dribblers and readers that do not read.

No timing assertions (project rule): latencies are printed (``-s``); ``make soak``
checks the 2x bound. What is asserted: normal requests are served while 200 connections
dribble their headers (each one ends before the first dribbler is cut off: an order of
events, not a duration), every dribbler is cut off by the header deadline, and a client
that does not read its stream holds no growing memory in the router.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reliability.server import RouterProcess, real_models, wait_until

pytestmark = pytest.mark.integration

DRIBBLERS = 200
HEADER_TIMEOUT_S = 6.0  # well above a few completions side by side (the assertion compares the two)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def timed_completion(r: RouterProcess, model: str = "m") -> float:
    async with r.aclient() as c:
        t = time.perf_counter()
        resp = await c.post("/v1/completions", json={"model": model, "prompt": "Hello", "max_tokens": 4,
                                                     "temperature": 0})
        assert resp.status_code == 200, resp.text
        return time.perf_counter() - t


async def dribble(port: int, cut: list[float], on_connect: Callable[[], None] | None = None) -> None:
    """Send a request's headers a byte at a time, forever; record when the server cut us off."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    if on_connect is not None:
        on_connect()
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 10_000
    try:
        for i in range(len(head)):
            writer.write(head[i:i + 1])
            await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    break  # EOF: the server closed the connection
            except asyncio.TimeoutError:
                continue
    except (ConnectionError, OSError):
        pass
    cut.append(time.monotonic() - t0)
    writer.close()


async def test_header_dribblers_do_not_starve_others(routers, model_path: Path) -> None:  # noqa: ANN001
    r = routers(real_models(model_path, "m", ctx_len=512, n_parallel=2), header_timeout_s=HEADER_TIMEOUT_S)
    await timed_completion(r)  # load
    idle = [await timed_completion(r) for _ in range(5)]
    cut: list[float] = []
    connected = 0
    all_connected = asyncio.Event()

    def on_connect() -> None:
        nonlocal connected
        connected += 1
        if connected == DRIBBLERS:
            all_connected.set()

    async def served_while_dribbling() -> float:
        latency = await timed_completion(r)
        cut_by_then.append(len(cut))
        return latency

    cut_by_then: list[int] = []
    tasks = [asyncio.create_task(dribble(r.port, cut, on_connect)) for _ in range(DRIBBLERS)]
    await asyncio.wait_for(all_connected.wait(), 60)
    # side by side (the model has 2 slots), so they are done well inside the header deadline
    # unless the dribblers starve them: then they would end only once dribblers are cut off
    busy = await asyncio.gather(*(served_while_dribbling() for _ in range(5)))
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert len(cut) == DRIBBLERS  # every dribbler was cut off (none ran its 10 kB of headers)
    assert cut_by_then == [0] * 5, f"requests ended only after {cut_by_then} dribblers were cut off"
    ratio = statistics.median(busy) / statistics.median(idle)
    print(f"\nlatency idle {statistics.median(idle) * 1000:.1f} ms, with {DRIBBLERS} dribblers "
          f"{statistics.median(busy) * 1000:.1f} ms (x{ratio:.2f}); cut after "
          f"{min(cut):.1f}-{max(cut):.1f} s (header_timeout_s={HEADER_TIMEOUT_S})")
    assert "Traceback" not in r.router_log()


def test_a_client_that_does_not_read_holds_no_growing_memory(routers, model_path: Path) -> None:  # noqa: ANN001
    r = routers(real_models(model_path, "m", ctx_len=1536, n_parallel=4))
    assert r.proc is not None
    with r.client() as c:
        assert c.post("/models/load", json={"model": "m"}).status_code == 200
    before = rss_kib(r.proc.pid)
    body = json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True,
                       "stream": True, "temperature": 0}).encode()
    socks = []
    for _ in range(4):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window: the router must hold back
        s.connect(("127.0.0.1", r.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        socks.append(s)

    def slots_busy() -> int:
        with r.client() as c:
            return sum(i["slots"]["busy"] for m in c.get("/models").json()["data"] for i in m["instances"])

    wait_until(lambda: slots_busy() == 4, 30, "the streams to start")
    wait_until(lambda: slots_busy() == 0, 300, "the worker to finish while nobody reads")
    during = rss_kib(r.proc.pid)
    for s in socks:  # now read everything: nothing was lost
        s.settimeout(60)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            assert chunk, "stream cut"
            data += chunk
        s.close()
        text = "".join(json.loads(line[6:])["choices"][0]["text"]
                       for line in data.decode().splitlines()
                       if line.startswith("data: {") and '"choices"' in line and '"text"' in line)
        assert b"data: [DONE]" in data and len(text) > 300
    grown = (during - before) / 1024
    print(f"\nrouter RSS {before / 1024:.1f} MiB -> {during / 1024:.1f} MiB with 4 unread streams")
    assert grown < 32, f"router memory grew {grown:.1f} MiB"
