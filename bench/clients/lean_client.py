"""A minimal HTTP/1.1 streaming client, for measuring what the router itself costs.

The overhead scenario compares a worker reached directly (``wire_driver.py``: msgspec
frames over a socket) with the same worker behind ``corral serve``. With httpx on the
HTTP side the client alone used 0.6 s of CPU where the direct client used 0.1 s in the
same c=8 run, on the same two cores the worker decodes on, so the ratio measured httpx
as much as the router. This client costs about what the direct one does: one keep-alive
connection per simulated user (asyncio streams), the request bytes built before the
clock starts, chunked transfer decoding by hand, one msgspec decode per SSE event.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bench.clients.loadgen import LoadResult, RequestResult, completion_body, summarize

_decode = msgspec.json.decode


class _Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def _stream_one(conn: _Conn, path: str, body: bytes, res: RequestResult) -> None:
    assert conn.reader is not None and conn.writer is not None
    head = (f"POST {path} HTTP/1.1\r\nHost: {conn.host}:{conn.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    t0 = time.perf_counter()
    res.t0 = t0
    conn.writer.write(head + body)
    reader = conn.reader
    status_and_headers = await reader.readuntil(b"\r\n\r\n")
    res.status = int(status_and_headers.split(b" ", 2)[1])
    chunked = b"transfer-encoding: chunked" in status_and_headers.lower()
    if res.status != 200 or not chunked:
        length = 0
        for line in status_and_headers.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        text = await reader.readexactly(length)
        res.error = f"HTTP {res.status}: {text[:200]!r}"
        res.latency_s = time.perf_counter() - t0
        return
    pending = b""
    chunks = 0
    last = t0
    usage_tokens: int | None = None
    done = False
    while not done:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            break
        pending += data[:-2]
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            payload = event[6:]
            if payload == b"[DONE]":
                done = True
                continue
            obj: Any = _decode(payload)
            if "error" in obj and not obj.get("choices"):
                res.error = f"stream error: {str(obj['error'])[:200]}"
                done = True
                continue
            choices = obj.get("choices") or ()
            if choices and choices[0].get("text"):
                chunks += 1
                now = time.perf_counter()
                if res.ttft_s is None:
                    res.ttft_s = now - t0
                else:
                    res.gaps_s.append(now - last)
                last = now
            usage = obj.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                usage_tokens = int(usage["completion_tokens"])
    if done:  # the terminating zero-size chunk
        while int((await reader.readuntil(b"\r\n")).strip(), 16) != 0:
            pass
        await reader.readexactly(2)
    res.completion_tokens = usage_tokens if usage_tokens is not None else chunks
    res.latency_s = time.perf_counter() - t0
    res.ok = res.error is None


async def run_load_lean(base_url: str, *, label: str, model: str | None, concurrency: int, n_requests: int,
                        max_tokens: int = 64, first_index: int = 0, timeout_s: float = 300.0,
                        raw: list[RequestResult] | None = None) -> LoadResult:
    """Closed loop like ``loadgen.run_load`` (streamed /v1/completions), with this client."""
    u = urlsplit(base_url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    counter = iter(range(first_index, first_index + n_requests))
    results: list[RequestResult] = []
    t0 = time.perf_counter()

    async def user() -> None:
        conn = _Conn(host, port)
        await conn.open()
        try:
            for i in counter:
                body = msgspec.json.encode(completion_body(model, i, max_tokens, stream=True))
                res = RequestResult(ok=False)
                try:
                    await asyncio.wait_for(_stream_one(conn, "/v1/completions", body, res), timeout_s)
                except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
                    res.error = f"{type(exc).__name__}: {exc}"[:200]
                    conn.close()
                    conn = _Conn(host, port)
                    await conn.open()
                results.append(res)
        finally:
            conn.close()

    await asyncio.gather(*(user() for _ in range(concurrency)))
    if raw is not None:
        raw.extend(results)
    return summarize(label, concurrency, results, time.perf_counter() - t0)


class LeanLatency:
    """1-token non-streamed completions one after another on one keep-alive connection,
    with a minimal HTTP/1.1 client (the request bytes built before the clock starts), so
    the client costs about what ``wire_driver``'s direct client costs (httpx spends about
    half a millisecond of its own per request here): the difference to the direct path is
    then the router's. ``one(prompt)`` returns the latency in ms."""

    def __init__(self, base_url: str, model: str | None) -> None:
        u = urlsplit(base_url)
        self._conn = _Conn(u.hostname or "127.0.0.1", u.port or 80)
        self._model = model

    async def __aenter__(self) -> "LeanLatency":
        await self._conn.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._conn.close()

    async def one(self, prompt: str, max_tokens: int = 1, timeout_s: float = 60.0) -> float:
        conn = self._conn
        assert conn.reader is not None and conn.writer is not None
        body = dict(completion_body(self._model, 0, max_tokens, stream=False), prompt=prompt)
        payload = msgspec.json.encode(body)
        req = (f"POST /v1/completions HTTP/1.1\r\nHost: {conn.host}:{conn.port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
        t0 = time.perf_counter()
        conn.writer.write(req)
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), timeout_s)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answer = await conn.reader.readexactly(length)
        ms = (time.perf_counter() - t0) * 1000
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"1-token request failed: {head.splitlines()[0]!r} {answer[:200]!r}")
        return ms


async def _post_one(conn: _Conn, path: str, body: bytes, res: RequestResult) -> None:
    """One non-streamed request on ``conn``; ``res`` gets its status, tokens and latency (a
    503's ``Retry-After`` is kept in ``res.error``)."""
    assert conn.reader is not None and conn.writer is not None
    head = (f"POST {path} HTTP/1.1\r\nHost: {conn.host}:{conn.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    t0 = time.perf_counter()
    res.t0 = t0
    conn.writer.write(head + body)
    got = await conn.reader.readuntil(b"\r\n\r\n")
    res.status = int(got.split(b" ", 2)[1])
    length, retry_after = 0, None
    for line in got.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length":
            length = int(value)
        elif key == b"retry-after":
            retry_after = value.strip().decode()
    answer = await conn.reader.readexactly(length)
    res.latency_s = time.perf_counter() - t0
    if res.status != 200:
        res.error = f"HTTP {res.status} (Retry-After: {retry_after})"
        return
    usage = _decode(answer).get("usage") or {}
    res.completion_tokens = int(usage.get("completion_tokens") or 0)
    res.ok = True


async def run_posts_lean(base_url: str, *, label: str, model: str | None, concurrency: int, n_requests: int,
                         max_tokens: int = 1, timeout_s: float = 60.0) -> LoadResult:
    """Closed loop of non-streamed /v1/completions with this client (``concurrency`` users,
    one keep-alive connection each)."""
    u = urlsplit(base_url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    counter = iter(range(n_requests))
    results: list[RequestResult] = []
    body = msgspec.json.encode(completion_body(model, 0, max_tokens, stream=False))
    t0 = time.perf_counter()

    async def user() -> None:
        conn = _Conn(host, port)
        await conn.open()
        try:
            for _ in counter:
                res = RequestResult(ok=False)
                try:
                    await asyncio.wait_for(_post_one(conn, "/v1/completions", body, res), timeout_s)
                except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
                    res.error = f"{type(exc).__name__}: {exc}"[:200]
                    conn.close()
                    conn = _Conn(host, port)
                    await conn.open()
                results.append(res)
        finally:
            conn.close()

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return summarize(label, concurrency, results, time.perf_counter() - t0)


async def open_loop_posts(base_url: str, *, model: str | None, rate_per_s: float, duration_s: float,
                          max_tokens: int = 1, timeout_s: float = 30.0, max_conns: int = 4096) -> list[RequestResult]:
    """Open loop: a non-streamed request every ``1 / rate_per_s`` seconds for ``duration_s``,
    whatever the answers (each on an idle kept-alive connection, else a new one, at most
    ``max_conns``): what a server does past its saturation. The results in order of start."""
    u = urlsplit(base_url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    body = msgspec.json.encode(completion_body(model, 0, max_tokens, stream=False))
    idle: list[_Conn] = []
    results: list[RequestResult] = []
    tasks: list[asyncio.Task[None]] = []
    opened = 0

    async def one(res: RequestResult) -> None:
        nonlocal opened
        conn = idle.pop() if idle else None
        if conn is None:
            if opened >= max_conns:
                res.error = "client: no connection left"
                return
            opened += 1
            conn = _Conn(host, port)
            try:
                await conn.open()
            except OSError as exc:
                res.error = f"connect: {exc}"[:200]
                opened -= 1
                return
        try:
            await asyncio.wait_for(_post_one(conn, "/v1/completions", body, res), timeout_s)
            idle.append(conn)
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"[:200]
            conn.close()
            opened -= 1

    t0 = time.perf_counter()
    k = 0
    while (now := time.perf_counter() - t0) < duration_s:
        due = int(now * rate_per_s) + 1
        while k < due:
            res = RequestResult(ok=False)
            res.t0 = time.perf_counter()
            results.append(res)
            tasks.append(asyncio.create_task(one(res)))
            k += 1
        await asyncio.sleep(max(0.0, (k / rate_per_s) - (time.perf_counter() - t0)))
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in idle:
        c.close()
    return results
