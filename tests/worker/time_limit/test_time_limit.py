"""t_max_predict_ms (worker/time_limit/): llama-server's time limit for generation, a step feature."""

from __future__ import annotations

import pytest

from corral import wire
from corral.worker.engine import Engine
from corral.worker.slots import Job, Slot
from corral.worker.time_limit.feature import TimeLimitFeature

from worker.conftest import run_engine

PROMPT = "A list of fruits, one a line:\n- apple\n- pear\n-"
GREEDY = wire.SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def _req(rid: str, ms: int = 0) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=PROMPT, params=GREEDY, t_max_predict_ms=ms)


def test_the_rule_ends_at_a_new_line_once_over_time() -> None:
    f, slot = TimeLimitFeature(), Slot(0)
    assert not f.admitted(slot, Job(_req("off"), [1], 0.0)) and slot.time_limit is None  # 0: not in the slot's list
    assert f.admitted(slot, Job(_req("on", 1000), [1], 0.0))
    slot.t_first = 0.0  # generating started long ago (perf_counter's epoch)
    assert f.token_accepted(slot, 7, wire.Delta("on", "no line yet", 1)) is None
    assert f.token_accepted(slot, 7, None) is None  # nothing released
    assert f.token_accepted(slot, 7, wire.Delta("on", "end\n", 1)) == "length"
    f.admitted(slot, Job(_req("on", 1 << 40), [1], 0.0))
    assert f.token_accepted(slot, 7, wire.Delta("on", "\n", 1)) is None  # within the limit


@pytest.mark.integration
def test_a_request_ends_with_length_at_the_first_line_after_its_limit(engine: Engine) -> None:
    texts, finals, _ = run_engine(engine, [_req("full"), _req("far", 1 << 40)])
    full = texts["full"]
    assert "\n" in full and texts["far"] == full  # a limit not reached changes nothing
    texts, finals, _ = run_engine(engine, [_req("cut", 1)])
    cut, fin = texts["cut"], finals["cut"]
    assert isinstance(fin, wire.Finished) and fin.finish_reason == "length"
    assert full.startswith(cut) and "\n" in cut and len(cut) < len(full)
    assert fin.usage.completion_tokens < GREEDY.max_tokens  # type: ignore[operator]
    assert engine.slots[fin.slot].features == ()  # the slot is free, its features with it


def test_the_dialects_pass_it_on_and_bound_it() -> None:
    from pydantic import ValidationError

    from corral.api.core.chat_request import ChatCompletionRequest
    from corral.api.core.generation import chat_spec, completion_spec
    from corral.api.core.schemas import CompletionRequest
    from corral.api.llamacpp.schemas import InfillBody

    chat = chat_spec(ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "t_max_predict_ms": 250}))
    comp = completion_spec(CompletionRequest.model_validate({"model": "m", "prompt": "x", "t_max_predict_ms": 9}))
    assert [r.t_max_predict_ms for r in chat.requests + comp.requests] == [250, 9]
    assert completion_spec(CompletionRequest.model_validate({"model": "m", "prompt": "x"})).requests[0].t_max_predict_ms == 0
    for bad in (-1, 1 << 41):
        with pytest.raises(ValidationError, match="t_max_predict_ms"):
            CompletionRequest.model_validate({"model": "m", "prompt": "x", "t_max_predict_ms": bad})
    assert InfillBody.model_validate({"input_prefix": "a", "t_max_predict_ms": 5}).t_max_predict_ms == 5
