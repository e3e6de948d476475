"""The per-request collector: merging for slow readers, errors after text, abort."""

from __future__ import annotations

import time

import pytest

from corral import wire
from corral.control.stream import RequestStream
from corral.errors import ContextLengthExceeded, WorkerCrashed


def _fin(n: int) -> wire.Finished:
    return wire.Finished("r", "stop", wire.Usage(1, n), wire.Timings(1, 1, 1, 1))


async def test_slow_reader_gets_merged_text_in_bounded_pieces() -> None:
    s = RequestStream("r", "m")
    t0 = time.perf_counter()
    for i in range(50_000):
        s.on_delta(wire.Delta("r", "ab", 1))
    assert time.perf_counter() - t0 < 1.0  # linear, not quadratic
    assert len(s._parts) <= 50_000 // 64 + 64
    s.on_end(_fin(50_000))
    piece = await s.next_piece()
    assert piece is not None and piece.text == "ab" * 50_000
    assert await s.next_piece() is None
    assert s.n_tokens == 50_000 and s.finished is not None


async def test_error_comes_after_the_text_before_it() -> None:
    s = RequestStream("r", "m")
    s.on_delta(wire.Delta("r", "x", 1))
    s.fail(WorkerCrashed("gone"))
    piece = await s.next_piece()
    assert piece is not None and piece.text == "x"
    with pytest.raises(WorkerCrashed):
        await s.next_piece()
    s2 = RequestStream("r", "m")
    s2.on_end(wire.RequestFailed("r", "context_length_exceeded", "too long"))
    with pytest.raises(ContextLengthExceeded):
        await s2.wait_started()
    with pytest.raises(ContextLengthExceeded):
        await s2.wait_done()


async def test_abort_without_instance_and_twice_is_harmless() -> None:
    s = RequestStream("r", "m")
    s.abort()
    s.abort()
    s.on_end(_fin(0))
    s.abort()
    await s.wait_done()
    assert s.take_all().text == ""


def test_end_handlers_run_once_last_added_first_and_one_failing_stops_none(caplog: pytest.LogCaptureFixture) -> None:
    s = RequestStream("r", "m")
    ran: list[str] = []
    s.at_end(lambda _: ran.append("usage"))
    s.at_end(lambda _: ran.append("queue"))

    def broken(_: RequestStream) -> None:
        raise RuntimeError("a handler's bug")

    s.at_end(broken)
    s.at_end(lambda _: ran.append("preempt"))
    s.fail(WorkerCrashed("gone"))
    assert ran == ["preempt", "queue", "usage"]
    assert any("end handler of request r failed" in r.getMessage() for r in caplog.records)
    s.fail(WorkerCrashed("again"))  # ended already: nothing runs twice
    s.at_end(lambda _: ran.append("late"))  # added after the end: runs at once
    assert ran == ["preempt", "queue", "usage", "late"]
