"""Ray benchmark pieces below the router: workers reached over a socketpair (optionally
pinned), over corral's Ray transport, or relayed through an actor; the ``relay``
scenario (how the frames travel). Run by ``python -m bench.ray.run``."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

import msgspec

from corral import wire
from corral.store.embedded import embedded_model_path

from bench.clients.loadgen import LoadResult
from bench.clients.wire_driver import DirectWorker
from bench.ray import relay as ray_relay
from bench.servers import PY

if TYPE_CHECKING:
    from bench.ray.context import Ctx


def log(msg: str) -> None:
    print(f"[ray-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table(title: str, cols: list[str], rows: list[list[str]], notes: list[str]) -> str:
    out = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out + [""] + [f"- {n}" for n in notes] + [""])


def settings(threads: int, n_parallel: int = 8, name: str = "bench") -> wire.WorkerSettings:
    return wire.WorkerSettings(model_id=name, model_path=str(embedded_model_path()), threads=threads,
                               n_parallel=n_parallel, ctx_len=1024 * n_parallel)


# ---------------------------------------------------------------- workers reached three ways


class PinnedWorker(DirectWorker):
    """A local worker on a socketpair, optionally pinned with taskset (the spawner's
    worker command starts with ``taskset -c CPUS``)."""

    def __init__(self, s: wire.WorkerSettings, name: str, cpus: str | None) -> None:
        prefix = ["taskset", "-c", cpus] if cpus else []
        super().__init__(s, name, worker_command=[*prefix, PY, "-m", "corral.worker"])
        self.cpus = cpus


class RayTcpWorker(PinnedWorker):
    """corral's Ray transport: a WorkerHost actor, then TCP straight to the worker."""

    def __init__(self, s: wire.WorkerSettings, name: str, resources: dict[str, float]) -> None:
        super().__init__(s, name, None)
        self.resources = resources
        self.actor: Any = None

    async def start(self, timeout_s: float = 120.0) -> float:
        import ray

        from corral.control.transport.ray.host import WorkerHost

        self._log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.actor = ray.remote(WorkerHost).options(num_cpus=1, resources=self.resources).remote(
            self.name, msgspec.json.encode(self.settings).decode(), None)
        info = await self.actor.place.remote()
        reader, writer = await asyncio.open_connection(info["host"], info["port"])
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writer.write(info["token"])
        return await self._attach(reader, writer, t0, timeout_s)

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
        if self._pump is not None:
            self._pump.cancel()


class RayRelayWorker(PinnedWorker):
    """The alternative: frames relayed by the actor (calls in, a streaming generator out)."""

    def __init__(self, s: wire.WorkerSettings, name: str, resources: dict[str, float]) -> None:
        super().__init__(s, name, None)
        self.resources = resources
        self.actor: Any = None
        self._relay: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 120.0) -> float:
        import ray

        self._log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.actor = ray.remote(ray_relay.RelayHost).options(num_cpus=1, resources=self.resources).remote(
            msgspec.json.encode(self.settings).decode())
        reader = asyncio.StreamReader()
        gen = self.actor.frames.remote()

        async def pump() -> None:
            async for ref in gen:
                reader.feed_data(await ref)
            reader.feed_eof()

        self._relay = asyncio.create_task(pump())
        return await self._attach(reader, ray_relay.ActorWriter(self.actor), t0, timeout_s)

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
        for t in (self._pump, self._relay):
            if t is not None:
                t.cancel()


async def load(w: PinnedWorker, label: str, c: int, n: int, first: int) -> LoadResult:
    return await w.run_load(label=label, concurrency=c, n_requests=n, max_tokens=64, first_index=first)


def row(r: LoadResult, ref: float | None) -> list[str]:
    ratio = f"{r.tok_s / ref:.2f}x" if ref else "-"
    ttft = f"{r.ttft_p50_ms:.0f}" if r.ttft_p50_ms is not None else "-"
    return [r.label, str(r.concurrency), f"{r.ok}/{r.n_requests}", f"{r.tok_s:.1f}", ttft, ratio]


COLS = ["setup", "c", "ok", "tok/s", "TTFT p50 ms", "ratio"]


async def sc_relay(ctx: "Ctx") -> str:
    s = settings(threads=2)
    ways: list[PinnedWorker] = [PinnedWorker(s, "relay-socketpair", None),
                                RayTcpWorker(s, "relay-ray-tcp", {"node_a": 1}),
                                RayRelayWorker(s, "relay-ray-generator", {"node_a": 1})]
    rows, notes = [], []
    totals: dict[str, list[LoadResult]] = {w.name: [] for w in ways}
    one_token: dict[str, list[float]] = {w.name: [] for w in ways}
    for rnd in range(ctx.rounds):
        for w in ways:
            await w.start()
            await load(w, w.name, 8, 8, 10_000)  # warm-up
            totals[w.name].append(await load(w, w.name, 8, ctx.n, rnd * 1000))
            one_token[w.name] += await w.sequential_latency(20)
            await w.stop()
    base = _merged(totals["relay-socketpair"])
    for w in ways:
        rows.append(row(_merged(totals[w.name]), base.tok_s))
    for w in ways:
        notes.append(f"{w.name}: per round " + ", ".join(f"{r.tok_s:.1f}" for r in totals[w.name]))
    notes.append("1-token request, one at a time, median latency (transport + one decode step): " + ", ".join(
        f"{w.name} {sorted(one_token[w.name])[len(one_token[w.name]) // 2]:.1f} ms" for w in ways))
    notes.append("one worker, threads 2, n_parallel 8, 64 tokens per request; ratio against the socketpair")
    return table("Ray relay: how the frames travel (c=8)", COLS, rows, notes)


async def combined_two(a: PinnedWorker, b: PinnedWorker, label: str, n: int, first: int) -> LoadResult:
    """Two workers loaded at once, c=4 each: their aggregate tok/s over the common wall time."""
    t0 = time.perf_counter()
    ra, rb = await asyncio.gather(load(a, "a", 4, n // 2, first), load(b, "b", 4, n // 2, first + 500))
    wall = time.perf_counter() - t0
    toks = ra.completion_tokens + rb.completion_tokens
    ttfts = [t for t in (ra.ttft_p50_ms, rb.ttft_p50_ms) if t is not None]
    return LoadResult(label=label, concurrency=8, n_requests=ra.n_requests + rb.n_requests, ok=ra.ok + rb.ok,
                      completion_tokens=toks, wall_s=wall, tok_s=toks / wall,
                      ttft_p50_ms=sum(ttfts) / len(ttfts) if ttfts else None)


def _merged(rs: list[LoadResult]) -> LoadResult:
    toks = sum(r.completion_tokens for r in rs)
    wall = sum(r.wall_s for r in rs)
    ttfts = [r.ttft_p50_ms for r in rs if r.ttft_p50_ms is not None]
    return LoadResult(label=rs[0].label, concurrency=rs[0].concurrency,
                      n_requests=sum(r.n_requests for r in rs), ok=sum(r.ok for r in rs),
                      completion_tokens=toks, wall_s=wall, tok_s=toks / wall if wall else 0.0,
                      ttft_p50_ms=sorted(ttfts)[len(ttfts) // 2] if ttfts else None)
