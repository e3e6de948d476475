"""The draft length rule and its measured costs (worker/speculation/cost.py), pure: no engine."""

from __future__ import annotations

import pytest

from corral import wire
from corral.worker.sampling.pool import Drawn
from corral.worker.slots import Slot
from corral.worker.speculation.cost import StepCosts, best_length
from corral.worker.speculation.speculator import PAUSE_STEPS, RECHECK_STEPS, Speculator


def test_a_draft_model_as_slow_as_the_model_does_not_draft() -> None:
    # the embedded model as its own draft on a CPU: a draft token costs the target ~0.35 of a
    # one-token step to verify and the draft ~1 to propose; accepted 95% of the time
    assert best_length(0.95, 1, 0.35, 1.0, 16) == 0  # no length pays: plain speed
    assert best_length(0.95, 1, 0.35, 0.0, 16) >= 4  # what a rule blind to the draft's cost would send
    assert best_length(1.0, 1, 0.35, 1.0, 16) == 0  # not even when every token is accepted
    # a small draft (the use case) costs little: it drafts, shorter than a free one
    assert 0 < best_length(0.95, 1, 0.35, 0.05, 16) <= best_length(0.95, 1, 0.35, 0.0, 16)
    assert best_length(0.95, 4, 0.35, 0.05, 16) <= best_length(0.95, 1, 0.35, 0.05, 16)  # 4 slots: shorter


def test_every_token_of_the_draft_pays_and_the_next_would_not() -> None:
    for r in (0.3, 0.7, 0.9, 0.99):
        for n_gen in (1, 4):
            for tc, dc in ((0.35, 0.0), (0.1, 0.02), (0.35, 0.3)):
                n = best_length(r, n_gen, tc, dc, 1000)
                step_rate = n_gen / (1 + tc * (n_gen - 1))  # tokens per cost of the step without the draft
                assert all(r ** j / (tc + dc) > step_rate for j in range(1, n + 1)), (r, n_gen, tc, dc)
                assert r ** (n + 1) / (tc + dc) <= step_rate, (r, n_gen, tc, dc)


def test_step_costs_fit_the_target_and_the_draft() -> None:
    c = StepCosts(0.35)
    assert (c.token_cost, c.draft_cost) == (0.35, 0.0)  # the prior, and no draft measured yet
    for _ in range(10):
        for n in (1, 3, 5):  # steps of 0.1 s + 0.03 s per token
            c.target(n, 0.1 + 0.03 * n)
    assert c.token_cost == pytest.approx(0.03 / 0.13)
    c.draft(4, 0.4)  # 0.1 s per slot-position: 0.77 one-token steps
    assert c.draft_cost == pytest.approx(0.1 / 0.13)
    same = StepCosts(0.35)
    for _ in range(10):
        same.target(4, 0.2)  # always 4 tokens: no slope to fit; the prior gives the one-token step
    assert same.token_cost == 0.35
    same.draft(1, 0.2 / (1 + 0.35 * 3))
    assert same.draft_cost == pytest.approx(1.0)


def _speculator() -> tuple[Speculator, Slot, object]:
    sp = Speculator(wire.WorkerSettings(model_id="m", model_path="x", speculative="draft", draft_max=8), 512)
    slot = Slot(0)
    slot.max_tokens = 100
    sp.start(slot, wire.GenerateRequest(id="r", prompt="x"))
    return sp, slot, type("M", (), {"n_ctx_slot": 1000})()


def test_a_draft_that_cannot_pay_is_not_even_probed_but_now_and_then() -> None:
    sp, slot, m = _speculator()
    st = slot.spec
    sp.costs.fixed = (0.35, 1.0)  # a draft as slow as the model: not even always accepted drafts pay
    assert sp._length(slot, st, 512, m, 1) == 0 and st.pause == 0  # type: ignore[arg-type]
    sp.gen_steps = RECHECK_STEPS  # a while later: one probe measures the costs again
    assert sp._length(slot, st, 512, m, 1) == 2 and st.pause == PAUSE_STEPS  # type: ignore[arg-type]
    st.pause = 0
    assert sp._length(slot, st, 512, m, 1) == 0  # type: ignore[arg-type]  # and then not for a while


def test_a_probe_that_is_accepted_but_does_not_pay_keeps_the_pause() -> None:
    sp, slot, m = _speculator()
    st = slot.spec
    sp.costs.fixed = (0.35, 0.3)
    st.hits, st.tries = 1.0, 4.0  # drafts seldom accepted: none pays, a probe may tell
    assert sp._length(slot, st, 512, m, 1) == 2 and st.probing  # type: ignore[arg-type]
    st.draft, st.base = [5, 6], 10
    sp.settle(slot, [Drawn(token=5), Drawn(token=6), Drawn(token=3)], None)  # type: ignore[arg-type]
    assert st.pause == PAUSE_STEPS  # accepted, yet drafting still does not pay: the pause stands
    assert sp._length(slot, st, 512, m, 1) == 0  # type: ignore[arg-type]
    st.pause, st.hits, st.tries = 0, 9.0, 10.0
    sp.costs.fixed = (0.35, 1.0)
    sp.gen_steps = RECHECK_STEPS
    assert sp._length(slot, st, 512, m, 1) == 2 and st.probing  # type: ignore[arg-type]
    sp.costs.fixed = (0.35, 0.0)  # the probe finds drafting pays now (a draft that costs nothing)
    st.draft, st.base = [5, 6], 10
    sp.settle(slot, [Drawn(token=5), Drawn(token=6), Drawn(token=3)], None)  # type: ignore[arg-type]
    assert st.pause == 0  # the pause ends
    assert sp._length(slot, st, 512, m, 1) >= 2 and not st.probing  # type: ignore[arg-type]
