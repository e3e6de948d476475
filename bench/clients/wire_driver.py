"""A small asyncio client that drives one corral worker directly over its socket.

Used by the router-overhead scenario: the same worker settings reached without
the HTTP router. Starts the worker as the router does (``LocalSpawner`` of
``corral.control.transport.link``: ``python -m corral.worker --fd N --settings JSON`` on a
socketpair, in its own session), waits for ``Ready`` and speaks ``corral.wire``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import time
from typing import Any

from corral import wire
from corral.control.transport.local import LocalSpawner

from bench.clients.loadgen import SAMPLING, RequestResult, LoadResult, make_prompt, summarize
from bench.servers import LOGS, PY


class WorkerDied(RuntimeError):
    pass


class DirectWorker:
    def __init__(self, settings: wire.WorkerSettings, name: str = "worker-direct",
                 worker_command: list[str] | None = None) -> None:
        """``worker_command``: the argv prefix (default ``PY -m corral.worker``)."""
        self.settings = settings
        self.name = name
        self.spawner = LocalSpawner(LOGS, worker_command or [PY, "-m", "corral.worker"])
        self.proc: subprocess.Popen | None = None
        self.ready: wire.Ready | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._ids = itertools.count()
        self._pump: asyncio.Task | None = None
        self._ready_fut: asyncio.Future | None = None
        self.log_path = LOGS / f"{name}.log"
        self.last_raw: list[RequestResult] = []

    async def start(self, timeout_s: float = 120.0) -> float:
        """Spawn the worker and wait for Ready; returns seconds to Ready."""
        LOGS.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.proc, sock = self.spawner.spawn_process(self.settings, stdout=self._log, stderr=subprocess.STDOUT)
        reader, writer = await asyncio.open_connection(sock=sock)
        return await self._attach(reader, writer, t0, timeout_s)

    async def _attach(self, reader: Any, writer: Any, t0: float, timeout_s: float) -> float:
        """Read frames from ``reader`` (``writer`` takes ours) and wait for Ready; seconds since ``t0``."""
        self._reader, self._writer = reader, writer
        self._ready_fut = asyncio.get_running_loop().create_future()
        self._pump = asyncio.create_task(self._read_loop())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready_fut), timeout_s)
        except asyncio.TimeoutError:
            raise WorkerDied(f"worker not ready after {timeout_s:.0f}s; log {self.log_path}") from None
        return time.perf_counter() - t0

    async def _read_loop(self) -> None:
        dec = wire.FrameDecoder()
        assert self._reader is not None
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                for body in dec.feed(data):
                    msg = wire.decode_from_worker(body)
                    if isinstance(msg, wire.Ready):
                        self.ready = msg
                        if not self._ready_fut.done():
                            self._ready_fut.set_result(msg)
                    elif isinstance(msg, wire.LoadFailed):
                        if not self._ready_fut.done():
                            self._ready_fut.set_exception(WorkerDied(f"LoadFailed: {msg.reason}"))
                    elif isinstance(msg, (wire.Delta, wire.Finished, wire.RequestFailed)):
                        q = self._queues.get(msg.id)
                        if q is not None:
                            q.put_nowait(msg)
        finally:
            err = WorkerDied(f"worker socket closed; log {self.log_path}")
            if self._ready_fut and not self._ready_fut.done():
                self._ready_fut.set_exception(err)
            for q in self._queues.values():
                q.put_nowait(err)

    async def generate(self, prompt: str, max_tokens: int, timeout_s: float = 300.0) -> RequestResult:
        assert self._writer is not None
        rid = f"b{next(self._ids)}"
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        params = wire.SamplingParams(
            max_tokens=max_tokens, ignore_eos=True,
            temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"],
            top_k=SAMPLING["top_k"], min_p=SAMPLING["min_p"],
        )
        res = RequestResult(ok=False)
        t0 = res.t0 = time.perf_counter()
        try:
            self._writer.write(wire.encode(wire.GenerateRequest(id=rid, prompt=prompt, params=params)))
            await self._writer.drain()
            async with asyncio.timeout(timeout_s):
                while True:
                    msg = await q.get()
                    if isinstance(msg, Exception):
                        res.error = str(msg)
                        break
                    if isinstance(msg, wire.Delta):
                        if msg.text and res.ttft_s is None:
                            res.ttft_s = time.perf_counter() - t0
                    elif isinstance(msg, wire.Finished):
                        res.completion_tokens = msg.usage.completion_tokens
                        res.ok = True
                        break
                    elif isinstance(msg, wire.RequestFailed):
                        res.error = f"{msg.code}: {msg.message}"
                        break
        except TimeoutError:
            res.error = f"timeout after {timeout_s:.0f}s"
        finally:
            self._queues.pop(rid, None)
        res.latency_s = time.perf_counter() - t0
        return res

    async def run_load(self, *, label: str, concurrency: int, n_requests: int, max_tokens: int = 64,
                       first_index: int = 0) -> LoadResult:
        counter = iter(range(first_index, first_index + n_requests))
        results: list[RequestResult] = []

        async def client() -> None:
            for i in counter:
                results.append(await self.generate(make_prompt(i), max_tokens))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        self.last_raw = results
        return summarize(label, concurrency, results, time.perf_counter() - t0)

    async def sequential_latency(self, n: int, max_tokens: int = 1) -> list[float]:
        out = []
        for i in range(n):
            r = await self.generate(make_prompt(100_000 + i), max_tokens)
            if not r.ok:
                raise WorkerDied(f"1-token request failed: {r.error}")
            out.append(r.latency_s * 1000)
        return out

    async def one_latency(self, prompt: str, max_tokens: int = 1) -> float:
        """One request with ``prompt``; its latency in ms."""
        r = await self.generate(prompt, max_tokens)
        if not r.ok:
            raise WorkerDied(f"1-token request failed: {r.error}")
        return r.latency_s * 1000

    async def stop(self) -> None:
        if self._writer is not None:
            try:
                self._writer.write(wire.encode(wire.Shutdown()))
                await self._writer.drain()
            except Exception:  # noqa: BLE001 - the worker may be gone already; stopping goes on
                pass
        p = self.proc
        if p is not None:
            for _ in range(50):
                if p.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            try:  # the worker if still there, and any stragglers of its group
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if self._writer is not None:
            self._writer.close()
        if self._pump is not None:
            self._pump.cancel()
        try:
            self._log.close()
        except Exception:  # noqa: BLE001 - closing a log at the end of a run
            pass
