"""Urgent starts in the real engine (worker/preempt/urgent.py): the request sent behind a Preempt
aborts the running decode, which is undone exactly (the streams are the ones a run without
the abort gives), and its prompt is prefilled alone: no other prompt, no other decode in its
step; the others go on in the next."""

from __future__ import annotations

import queue
import time

import pytest

from corral import wire
from corral.worker.engine import Engine
from corral.worker.preempt.urgent import PREEMPT_GAP_S

from worker.preempt.test_preempt_engine import Run, fresh, gen

pytestmark = pytest.mark.integration

SHORT = wire.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _behind_a_preempt(engine: Engine, req: wire.GenerateRequest) -> "queue.SimpleQueue[object]":
    """What the worker's reader thread does with a request read right behind a Preempt."""
    inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
    engine.preempt.urgent.put(inbox, wire.Preempt("someone"), None)
    engine.preempt.urgent.put(inbox, req, req.id)
    return inbox


def _scenario(engine: Engine, *, abort: bool) -> Run:
    """Two streams generating, a third prompt just submitted; an urgent request arrives (while
    the step runs: its decode is aborted; or between steps: nothing to abort)."""
    fresh(engine)
    run = Run(engine)
    for rid, prompt in (("a", "A recipe for bread:"), ("b", "def fibonacci(n):")):
        engine.submit(gen(rid, prompt, SHORT))
    run.until(lambda: run.tokens.get("a", 0) >= 3)
    engine.submit(gen("d", "Dear Sir or Madam,", SHORT))  # prefilling in the next step
    urgent_req = gen("u", "The weather today", SHORT)
    u = engine.preempt.urgent
    if abort:
        _behind_a_preempt(engine, urgent_req)
        aborts = u.aborts
        assert engine.step() == []  # aborted at its first graph node: nothing drawn, nothing sent
        assert u.aborts == aborts + 1
        d = next(s for s in engine.slots if s.job is not None and s.job.req.id == "d")
        assert d.prompt_pos == d.n_cached and len(d.cached) == d.n_cached  # its chunk undone
    else:
        _behind_a_preempt(engine, urgent_req)
    u.take("u")  # the engine loop takes it out of the inbox
    engine.submit(urgent_req)
    before = dict(run.tokens)
    run.take(engine.step())
    d = next(s for s in engine.slots if s.job is not None and s.job.req.id == "d")
    assert d.prompt_pos == d.n_cached  # its prompt waited: the urgent one went alone
    assert run.tokens.get("u") == 1  # the urgent request's first token, from its first step
    assert {k: run.tokens[k] for k in "ab"} == {k: before[k] for k in "ab"}  # nothing else decoded in it
    run.take(engine.step())
    assert all(run.tokens[k] == before[k] + 1 for k in "ab")  # then they go on, and d's prompt joins
    assert d.job is not None and d.prompt_pos == len(d.job.tokens) - 4  # its last 4 next (prefill.prompt_cuts)
    run.to_end()
    return run


def test_an_aborted_decode_is_undone_exactly(engine: Engine) -> None:
    if not engine.preempt.urgent.can_abort:
        pytest.skip("no C library strlen here: urgent requests are not aborted for")
    calm = _scenario(engine, abort=False)
    aborted = _scenario(engine, abort=True)
    assert aborted.texts == calm.texts and set(calm.texts) == {"a", "b", "d", "u"}
    for rid in "abdu":
        fin = aborted.finals[rid]
        assert isinstance(fin, wire.Finished) and fin.usage.completion_tokens == SHORT.max_tokens
    assert not engine.preempt.urgent.ids  # their prompts are in: nobody is urgent any more


def test_only_a_request_right_behind_a_preempt_is_urgent(engine: Engine) -> None:
    u = engine.preempt.urgent
    inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
    u.put(inbox, gen("plain"), "plain")  # no Preempt before it
    u.take("plain")
    assert "plain" not in u.ids
    u.put(inbox, wire.Preempt("x"), None)
    u.put(inbox, wire.RequestFailed("bad", "invalid_request", "no"), "bad")  # failed in prepare: never taken
    u.put(inbox, gen("first"), "first")
    u.put(inbox, gen("second"), "second")  # one Preempt makes room for one request
    u.take("bad")
    u.take("first")
    u.take("second")
    assert u.ids == {"first"}
    u._preempts.append(time.monotonic() - 2 * PREEMPT_GAP_S)  # a Preempt long ago (nothing followed it)
    u.put(inbox, gen("late"), "late")
    u.take("late")
    assert u.ids == {"first"}
    assert [type(inbox.get_nowait()).__name__ for _ in range(6)] == [
        "GenerateRequest", "Preempt", "RequestFailed", "GenerateRequest", "GenerateRequest", "GenerateRequest"]
    u.ids.clear()
