"""The step-feature interface (``StepFeature``, worker/slots.py) run with a feature of the test's
own: the engine runs its moments, per slot only for the requests it joined, and a moment marked
``*`` has one owner or the engine's plain path (worker/features.py, worker/intake.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from corral import wire
from corral.worker.engine import Engine
from corral.worker.features import Moments
from corral.worker.intake import Intake
from corral.worker.preempt.preemption import Preemption
from corral.worker.preempt.urgent import UrgentDecode
from corral.worker.prompt.prompts import PromptPreparer
from corral.worker.reasoning.plan import ReasoningPlan
from corral.worker.slots import Job, Slot, StepFeature, owner
from corral.worker.time_limit.feature import TimeLimitFeature

from .conftest import run_engine

PARAMS = wire.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
STOP_AFTER = 3


class Recorder(StepFeature):
    """Joins the requests whose id starts with "mine" and ends them after ``STOP_AFTER`` tokens;
    prepares every prompt (the ``prompt`` moment) and records each moment it sees."""

    def __init__(self) -> None:
        self.prompted: list[str] = []
        self.admitted_ids: list[str] = []
        self.batches = 0
        self.tokens: dict[str, int] = {}
        self.finished_ids: list[str] = []

    def prompt(self, req: wire.GenerateRequest, prompts: PromptPreparer) -> tuple[list[int], ReasoningPlan | None]:
        self.prompted.append(req.id)
        return prompts.tokens(req), None

    def admitted(self, slot: Slot, job: Job) -> bool:
        self.admitted_ids.append(job.req.id)
        return job.req.id.startswith("mine")

    def before_batch(self, slots: list[Slot]) -> list[Slot]:
        self.batches += 1
        return slots

    def token_accepted(self, slot: Slot, token: int, delta: wire.Delta | None) -> wire.FinishReason | None:
        assert slot.job is not None
        rid = slot.job.req.id
        self.tokens[rid] = self.tokens.get(rid, 0) + 1
        return "stop" if self.tokens[rid] == STOP_AFTER else None

    def finished(self, slot: Slot, fin: wire.Finished) -> None:
        self.finished_ids.append(fin.id)


@contextmanager
def with_feature(engine: Engine, feature: StepFeature) -> Iterator[None]:
    """``engine`` with ``feature`` listed last, as ``features.step_features`` would list it."""
    saved = engine.features, engine.on, engine.intake, engine.prepare
    engine.features = [*engine.features, feature]
    engine.on = Moments(engine.features, engine.m.ctx)
    engine.intake = Intake(engine.settings, engine.m, engine.prompts, engine.lora, engine.features)
    engine.prepare = engine.intake.prepare
    try:
        yield
    finally:
        engine.features, engine.on, engine.intake, engine.prepare = saved


def req(rid: str) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt="The colours of the rainbow are", params=PARAMS)


@pytest.mark.integration
def test_a_feature_of_its_own_runs_through_the_interface(engine: Engine) -> None:
    rec = Recorder()
    with with_feature(engine, rec):
        _, finals, _ = run_engine(engine, [req("mine"), req("other")])
    mine, other = finals["mine"], finals["other"]
    assert isinstance(mine, wire.Finished) and isinstance(other, wire.Finished)
    assert rec.prompted == ["mine", "other"]  # its prompt moment prepared both (not the plain path)
    assert sorted(rec.admitted_ids) == ["mine", "other"]  # every admission asks every feature
    assert rec.batches > 0  # an engine-wide moment: every step
    assert rec.tokens == {"mine": STOP_AFTER}  # per-slot moments: only where it joined
    assert (mine.finish_reason, mine.usage.completion_tokens) == ("stop", STOP_AFTER)  # it ended the request
    assert (other.finish_reason, other.usage.completion_tokens) == ("length", PARAMS.max_tokens)
    assert rec.finished_ids == ["mine"]
    assert all(s.features == () for s in engine.slots)  # freed with their slots
    _, finals, _ = run_engine(engine, [req("mine-again")])  # gone with it: nothing of it runs
    fin = finals["mine-again"]
    assert isinstance(fin, wire.Finished) and fin.usage.completion_tokens == PARAMS.max_tokens
    assert rec.prompted == ["mine", "other"]


def test_moments_list_only_the_features_that_have_them() -> None:
    rec, limit = Recorder(), TimeLimitFeature()
    on = Moments([limit, rec], None)  # type: ignore[arg-type]  # the plain decode is not called here
    assert on.before_batch == [rec] and on.idle == [] and on.before_admit == []
    assert on.write_decodes.__name__ == "write_pending"  # nobody has it: the plain path

    def plain(req: wire.GenerateRequest, prompts: PromptPreparer) -> tuple[list[int], ReasoningPlan | None]:
        return [], None

    assert owner([limit], "prompt", plain) is plain
    assert owner([limit, rec], "prompt", plain) == rec.prompt
    with pytest.raises(AssertionError, match="more than one feature"):
        owner([rec, Recorder()], "prompt", plain)


@pytest.mark.integration
def test_a_model_that_does_not_think_prepares_prompts_on_the_plain_path(engine: Engine) -> None:
    assert engine.intake.prompt == engine.intake.plain_prompt and not engine.reasoning.on
    asks = wire.GenerateRequest(id="think", messages=[wire.ChatMessage(role="user", content="hi")], think=True,
                                params=PARAMS)
    _, finals, _ = run_engine(engine, [asks])
    fin = finals["think"]
    assert isinstance(fin, wire.RequestFailed) and "does not support thinking" in fin.message
    raw = wire.GenerateRequest(id="raw", prompt="hi", think=True, params=PARAMS)
    _, finals, _ = run_engine(engine, [raw])
    fin = finals["raw"]
    assert isinstance(fin, wire.RequestFailed) and "not from a raw prompt" in fin.message


@pytest.mark.integration
def test_preemption_is_listed_on_a_generation_engine(engine: Engine) -> None:
    kinds = [type(f) for f in engine.features]
    assert kinds[-1] is Preemption
    assert (UrgentDecode in kinds) == engine.preempt.urgent.can_abort  # the plain decode where it cannot
