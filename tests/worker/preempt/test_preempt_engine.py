"""Pausing and resuming a generation in the real engine (worker/preempt/preemption.py): the same greedy
tokens with the KV kept in the host store and with it dropped (recomputed), a grammar
request paused midway, a pause before the request had a slot, abort while paused."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import wire
from corral.worker.engine import Engine
from corral.worker.preempt.preemption import store_key

from worker.conftest import run_engine, settings_for

pytestmark = pytest.mark.integration

LONG = wire.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
PROMPT = "The history of the Roman empire begins"
OTHER = ["A recipe for bread:", "def fibonacci(n):", "Dear Sir or Madam,", "The weather today"]


def gen(rid: str, prompt: str = PROMPT, params: wire.SamplingParams = LONG, **kw: object) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, params=params, **kw)  # type: ignore[arg-type]


class Run:
    """Steps an engine, collecting each request's text and final message."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.texts: dict[str, str] = {}
        self.tokens: dict[str, int] = {}
        self.finals: dict[str, wire.FromWorker] = {}

    def take(self, msgs: list[wire.FromWorker] | list[object]) -> None:
        for m in msgs:
            if isinstance(m, wire.Delta):
                self.texts[m.id] = self.texts.get(m.id, "") + m.text
                self.tokens[m.id] = self.tokens.get(m.id, 0) + m.n_tokens
            elif isinstance(m, (wire.Finished, wire.RequestFailed)):
                self.finals[m.id] = m

    def until(self, done: object, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if done():  # type: ignore[operator]
                return
            self.take(self.e.step())
        raise AssertionError("condition not reached")

    def to_end(self) -> None:
        self.until(lambda: not self.e.has_work)
        self.take(self.e.take_output())


def fresh(engine: Engine) -> None:
    """Every slot's cache (and the prompt cache) emptied: the next prompt is prefilled whole (a reused prefix decodes
    the prompt's last token alone, in another batch shape, which can flip a near tie)."""
    for s in engine.slots:
        assert not s.busy
        engine._clear_slot(s)
    engine.prompt_cache.store.clear()  # nor a saved prefix of it in the prompt cache


def reference(engine: Engine, req: wire.GenerateRequest) -> str:
    fresh(engine)
    texts, finals, _ = run_engine(engine, [req])
    assert isinstance(finals[req.id], wire.Finished)
    return texts[req.id]


def _idle_and_clean(engine: Engine) -> None:
    assert not engine.has_work and not engine.preempt.held
    assert all(not s.busy and s.sampler is None for s in engine.slots)
    assert engine.prompt_cache.store.pinned_bytes == 0


def _pause_resume(engine: Engine, req: wire.GenerateRequest, *, fill_slots: bool) -> tuple[Run, wire.Paused]:
    """Run ``req`` 8 tokens in, pause it, (fill every slot with other requests), resume it, run to the end."""
    fresh(engine)
    run = Run(engine)
    engine.submit(req)
    run.until(lambda: run.tokens.get(req.id, 0) >= 8)
    paused = engine.preempt.pause(req.id)
    assert paused.paused
    assert not any(s.job is not None and s.job.req.id == req.id for s in engine.slots)
    n_paused = run.tokens[req.id]
    if fill_slots:  # the paused slot's cells are overwritten: resume restores or recomputes elsewhere
        for k, p in enumerate(OTHER):
            engine.submit(gen(f"other{k}", p, wire.SamplingParams(max_tokens=6, temperature=0.0)))
        run.until(lambda: all(s.busy for s in engine.slots))
    else:
        run.take(engine.step())  # a step without it
    assert run.tokens[req.id] == n_paused  # nothing streams while paused
    engine.preempt.resume(req.id)
    run.to_end()
    return run, paused


def test_pause_resume_in_place_gives_the_same_tokens(engine: Engine) -> None:
    want = reference(engine, gen("ref"))
    run, paused = _pause_resume(engine, gen("p1"), fill_slots=False)
    assert paused.kept_kv and paused.n_tokens > 8 and paused.state_bytes > 0
    assert run.texts["p1"] == want
    fin = run.finals["p1"]
    assert isinstance(fin, wire.Finished) and fin.usage.completion_tokens == LONG.max_tokens
    _idle_and_clean(engine)


def test_kv_kept_restores_into_another_slot(engine: Engine) -> None:
    want = reference(engine, gen("ref"))
    run, paused = _pause_resume(engine, gen("p2"), fill_slots=True)
    assert paused.kept_kv
    assert run.texts["p2"] == want
    assert all(isinstance(run.finals[f"other{k}"], wire.Finished) for k in range(len(OTHER)))
    _idle_and_clean(engine)


def test_kv_dropped_is_recomputed_with_the_same_tokens(engine: Engine) -> None:
    want = reference(engine, gen("ref"))
    capacity, engine.prompt_cache.store.capacity = engine.prompt_cache.store.capacity, 0  # no room: the state is dropped
    recomputed = engine.preempt.recomputed
    try:
        run, paused = _pause_resume(engine, gen("p3"), fill_slots=True)
    finally:
        engine.prompt_cache.store.capacity = capacity
    assert not paused.kept_kv and paused.state_bytes == 0
    assert engine.preempt.recomputed == recomputed + 1
    assert run.texts["p3"] == want
    _idle_and_clean(engine)


def test_grammar_request_paused_midway(engine: Engine) -> None:
    g = 'root ::= "[" item ", " item ", " item ", " item ", " item ", " item "]"\nitem ::= [1-9] [0-9]*'
    params = wire.SamplingParams(max_tokens=30, temperature=0.0)
    want = reference(engine, gen("gref", "A list of numbers:", params, grammar=g))
    capacity, engine.prompt_cache.store.capacity = engine.prompt_cache.store.capacity, 0
    try:  # the grammar's state lives in the sampler: it survives even a recompute
        run, _ = _pause_resume(engine, gen("g1", "A list of numbers:", params, grammar=g), fill_slots=True)
    finally:
        engine.prompt_cache.store.capacity = capacity
    assert run.texts["g1"] == want and want.startswith("[") and want.endswith("]") and want.count(",") == 5
    _idle_and_clean(engine)


def test_paused_before_it_had_a_slot(engine: Engine) -> None:
    want = reference(engine, gen("ref"))
    fresh(engine)
    engine.submit(gen("q1"))
    paused = engine.preempt.pause("q1")  # still in the engine's queue
    assert paused.paused and paused.n_tokens == 0
    assert not engine.has_work
    engine.preempt.resume("q1")
    run = Run(engine)
    run.to_end()
    assert run.texts["q1"] == want
    _idle_and_clean(engine)


def test_abort_while_paused_frees_everything(engine: Engine) -> None:
    run = Run(engine)
    engine.submit(gen("a1"))
    run.until(lambda: run.tokens.get("a1", 0) >= 4)
    assert engine.preempt.pause("a1").kept_kv
    assert store_key("a1") in engine.prompt_cache.store
    assert not engine.preempt.pause("a1").paused  # twice: nothing more to pause
    engine.abort("a1")
    run.take(engine.take_output())
    fin = run.finals["a1"]
    assert isinstance(fin, wire.Finished) and fin.finish_reason == "abort"
    assert fin.usage.completion_tokens == run.tokens["a1"]
    assert store_key("a1") not in engine.prompt_cache.store
    _idle_and_clean(engine)
    engine.preempt.resume("a1")  # a late resume of an aborted request: nothing
    assert not engine.has_work
    # the id is free again, and the engine serves as before
    texts, finals, _ = run_engine(engine, [gen("a1", params=wire.SamplingParams(max_tokens=3, temperature=0.0))])
    assert isinstance(finals["a1"], wire.Finished)


def test_unknown_or_finished_requests_are_not_paused(engine: Engine) -> None:
    assert not engine.preempt.pause("nobody").paused
    run_engine(engine, [gen("done", params=wire.SamplingParams(max_tokens=2, temperature=0.0))])
    assert not engine.preempt.pause("done").paused
    _idle_and_clean(engine)


def test_engine_failure_fails_paused_requests(engine: Engine) -> None:
    run = Run(engine)
    engine.submit(gen("f1"))
    run.until(lambda: run.tokens.get("f1", 0) >= 2)
    assert engine.preempt.pause("f1").paused
    run.take(engine.fail_all("boom"))
    fail = run.finals["f1"]
    assert isinstance(fail, wire.RequestFailed) and fail.code == "internal"
    _idle_and_clean(engine)


def test_speculation_state_survives_a_pause(model_path: Path) -> None:
    e = Engine(settings_for(model_path, speculative="ngram", n_parallel=2, ctx_len=2048))
    try:
        text = "one two three four five six seven eight nine ten " * 3
        req = gen("s", text, wire.SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
        want = reference(e, req)
        fresh(e)
        run = Run(e)
        e.submit(req)
        run.until(lambda: run.tokens.get("s", 0) >= 8)
        slot = next(s for s in e.slots if s.busy)
        spec = slot.spec
        assert spec.on
        assert e.preempt.pause("s").paused
        assert slot.spec is not spec
        e.submit(gen("o", OTHER[0], wire.SamplingParams(max_tokens=20, temperature=0.0)))
        run.until(lambda: slot.busy)  # the other request took the paused one's slot
        e.preempt.resume("s")
        run.until(lambda: any(s.busy and s.job is not None and s.job.req.id == "s" for s in e.slots))
        now = next(s for s in e.slots if s.job is not None and s.job.req.id == "s")
        assert now is not slot and now.spec is spec
        run.to_end()
        assert run.texts["s"] == want
        _idle_and_clean(e)
    finally:
        e.close()


def test_stop_string_matched_after_the_pause(engine: Engine) -> None:
    full = reference(engine, gen("ref"))
    stop = full[len(full) * 2 // 3:][:6]  # a string that comes well after the pause point
    params = wire.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[stop])
    want = reference(engine, gen("sref", params=params))
    assert len(want) < len(full) and stop not in want
    run, _ = _pause_resume(engine, gen("s1", params=params), fill_slots=True)
    fin = run.finals["s1"]
    assert run.texts["s1"] == want and isinstance(fin, wire.Finished) and fin.finish_reason == "stop"
    assert fin.stop_string == stop
    _idle_and_clean(engine)
