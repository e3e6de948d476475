"""An error in the router's own handling of a worker's message (the request's stream, the
slot release) fails that one request and is logged as a router error; the worker and its
other requests carry on. Only a frame that cannot be decoded kills the worker."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from corral import wire
from corral.control.instance.instance import InstanceState
from corral.control.scheduling.pool import ModelPool
from corral.control.stream import RequestStream
from corral.errors import InternalError, WorkerCrashed
from support.fake_link import FakeLink, FakeSpawner, fake_pool, finished, spec
from support.harness import Harness, _until, chat

S = InstanceState


def _router_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "router error" in r.getMessage() and r.exc_info is not None]


# ---------------------------------------------------------------- with a worker process


async def test_a_router_error_fails_its_request_and_spares_the_worker(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    await harness.serve(
        {"a": {"path": str(harness.script("a", slow_delay_s=0.5)), "n_parallel": 2}})
    plane = harness.plane
    c = harness.client
    assert (await c.post("/models/load", json={"model": "a"})).status_code == 200
    pool = plane.pools["a"]
    inst = pool.instances[0]
    pid = inst.pid
    armed, victim = False, []
    real = RequestStream.on_delta

    def on_delta(self: RequestStream, msg: wire.Delta) -> None:
        if armed and not victim:
            victim.append(self.id)
        if victim and self.id == victim[0]:
            raise RuntimeError("a bug in the router's stream")
        real(self, msg)

    monkeypatch.setattr(RequestStream, "on_delta", on_delta)
    both = [asyncio.create_task(c.post("/v1/chat/completions", json=chat("a", f"SLOW {k}"))) for k in (1, 2)]
    await _until(lambda: pool.inflight == 2)  # both on the worker before the first piece comes
    armed = True
    with caplog.at_level(logging.ERROR, logger="corral.link"):
        answers = await asyncio.gather(*both)
    codes = sorted(r.status_code for r in answers)
    assert codes == [200, 500], [r.text for r in answers]
    failed = next(r for r in answers if r.status_code == 500)
    served = next(r for r in answers if r.status_code == 200)
    assert failed.json()["error"]["code"] == "internal_error"
    assert served.json()["choices"][0]["message"]["content"] == "Hello, world!"
    assert inst.state is S.READY and inst.pid == pid and inst.restarts == 0 and inst.failures == 0
    assert _router_errors(caplog) and not any("bad frame" in r.getMessage() for r in caplog.records)
    assert {"type": "abort", "id": victim[0]} in harness.requests_seen("a")  # the worker was told to stop it
    await _until(lambda: pool.inflight == 0)  # its end freed the slot
    r = await c.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 200 and inst.pid == pid


# ---------------------------------------------------------------- with a fake link


async def _ready(pool: ModelPool, spawner: FakeSpawner) -> FakeLink:
    pool.start()
    await pool.wait_ready(5)
    return spawner.links[-1]


def _send(pool: ModelPool, stream: RequestStream) -> None:
    inst = pool.try_acquire(None)
    assert inst is not None
    assert inst.submit(stream.id, wire.encode(wire.GenerateRequest(id=stream.id, prompt="hi")), stream)


class _BrokenDelta(RequestStream):
    def on_delta(self, msg: wire.Delta) -> None:
        raise RuntimeError("a bug in the router's stream")


class _BrokenEnd(RequestStream):
    def on_end(self, msg: Any) -> None:
        raise RuntimeError("a bug in the router's stream")


async def test_a_router_error_on_a_delta_stops_that_request_on_the_worker(
        caplog: pytest.LogCaptureFixture) -> None:
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(n_parallel=2))
    link = await _ready(pool, spawner)
    inst = pool.instances[0]
    bad, good = _BrokenDelta("r1", "m"), RequestStream("r2", "m")
    _send(pool, bad)
    _send(pool, good)
    with caplog.at_level(logging.ERROR, logger="corral.link"):
        link.say(wire.Delta("r1", "x", 1), wire.Delta("r2", "y", 1), wire.Delta("r1", "z", 1))
    assert isinstance(bad.error, InternalError) and good.error is None and not good.done
    assert link.aborted() == ["r1"] and not link.killed
    assert _router_errors(caplog)
    assert pool.busy(inst) == 2  # the worker still runs it until it answers the Abort
    link.say(finished("r1", 0, "abort"))
    assert pool.busy(inst) == 1 and bad.finished is None and isinstance(bad.error, InternalError)
    link.say(wire.Delta("r2", "!", 1), finished("r2", 2))
    assert good.finished is not None and good.take_all().text == "y!"
    assert pool.busy(inst) == 0 and inst.state is S.READY and link.exit is None


async def test_a_router_error_ending_a_request_still_frees_its_slot(caplog: pytest.LogCaptureFixture) -> None:
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(n_parallel=2))
    link = await _ready(pool, spawner)
    bad, good = _BrokenEnd("r1", "m"), RequestStream("r2", "m")
    _send(pool, bad)
    _send(pool, good)
    with caplog.at_level(logging.ERROR, logger="corral.link"):
        link.say(finished("r1"), wire.Delta("r2", "y", 1), finished("r2"))
    assert isinstance(bad.error, InternalError) and bad.done
    assert good.error is None and good.finished is not None
    assert pool.inflight == 0 and not link.killed and link.aborted() == []
    assert _router_errors(caplog)


async def test_a_router_error_releasing_a_slot_spares_the_worker(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = ModelPool.release
    armed: list[bool] = []

    def release(self: ModelPool, inst: Any) -> None:
        if armed and armed.pop():
            raise RuntimeError("a bug in the pool")
        real(self, inst)

    monkeypatch.setattr(ModelPool, "release", release)
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(n_parallel=2))
    link = await _ready(pool, spawner)
    first, second = RequestStream("r1", "m"), RequestStream("r2", "m")
    _send(pool, first)
    _send(pool, second)
    armed.append(True)  # the next release fails
    with caplog.at_level(logging.ERROR, logger="corral.link"):
        link.say(finished("r1"))
    link.say(finished("r2"))
    assert first.finished is not None and first.error is None  # its answer had been delivered
    assert second.finished is not None and not link.killed and link.exit is None
    assert _router_errors(caplog)


async def test_a_malformed_frame_kills_the_worker(caplog: pytest.LogCaptureFixture) -> None:
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(), max_restarts=0)
    link = await _ready(pool, spawner)
    inst = pool.instances[0]
    running = RequestStream("r1", "m")
    _send(pool, running)
    with caplog.at_level(logging.ERROR, logger="corral.link"):
        link.receive(b"\x00\x00\x00\x03xyz")
    assert link.killed
    await _until(lambda: inst.state is S.FAILED)
    assert isinstance(running.error, WorkerCrashed)
    assert any("bad frame" in r.getMessage() for r in caplog.records) and not _router_errors(caplog)
