"""Reasoning on the real engine: chat templates of each family set on the embedded Gemma,
whose tags span several of its tokens (it has no ``<think>`` token). A few-shot prompt
makes the model write the close tag itself; the worker forces the open tag, the budget's
close and harmony's channel headers as real tokens in the sampling step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import wire
from corral.worker.engine import Engine

from worker.conftest import run_engine, settings_for

OPENED = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}assistant: <think>\n{% endif %}")
QWEN_LIKE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
             "{% if add_generation_prompt %}assistant: {% if enable_thinking is defined and not enable_thinking %}"
             "<think>\n\n</think>\n\n{% endif %}{% endif %}")
HARMONY = ("{% for m in messages %}<|start|>{{ m['role'] }}{% if m['role'] == 'assistant' %}<|channel|>final"
           "{% endif %}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
           "{% if add_generation_prompt %}<|start|>assistant{% endif %}")
SHOTS = "".join(f"user: What is {a}+{a}?\nassistant: <think>\n{a} plus {a} is {2 * a}.\n</think>\n\n"
                f"The answer is {2 * a}.\n" for a in (1, 2, 3, 4))
MSGS = [wire.ChatMessage("system", SHOTS), wire.ChatMessage("user", "What is 5+5?")]
G = wire.SamplingParams(max_tokens=40, temperature=0.0, stop=["\nuser:"])  # a base model goes on
SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


def _engine(model_path: Path, template: str, **kw: object) -> Iterator[Engine]:
    e = Engine(settings_for(model_path, chat_template=template, n_parallel=4, ctx_len=4096, **kw))
    yield e
    e.close()


@pytest.fixture(scope="module")
def opened(model_path: Path) -> Iterator[Engine]:
    yield from _engine(model_path, OPENED, reasoning_budget_max=64)


@pytest.fixture(scope="module")
def qwen(model_path: Path) -> Iterator[Engine]:
    yield from _engine(model_path, QWEN_LIKE, reasoning_format="deepseek")


def chat(rid: str, **kw: object) -> wire.GenerateRequest:
    kw.setdefault("params", G)
    return wire.GenerateRequest(id=rid, messages=MSGS, **kw)  # type: ignore[arg-type]


def split(deltas: list[wire.Delta]) -> tuple[str, str]:
    return "".join(d.reasoning for d in deltas), "".join(d.text for d in deltas)


def no_tag_in_any_piece(deltas: list[wire.Delta], tags: tuple[str, ...]) -> None:
    for d in deltas:
        for tag in tags:
            assert tag not in d.reasoning and tag not in d.text, d


def test_the_model_closes_its_thinking_itself(opened: Engine) -> None:
    assert opened.info.reasoning_format == "deepseek" and len(opened.reasoning.close_ids) > 1
    _, finals, deltas = run_engine(opened, [chat("a")])
    thought, answer = split(deltas["a"])
    assert thought == "5 plus 5 is 10."
    assert answer.startswith("The answer is 10.")
    no_tag_in_any_piece(deltas["a"], ("<think>", "</think>", "</", "think>"))
    fin = finals["a"]
    assert 0 < fin.usage.reasoning_tokens < fin.usage.completion_tokens and fin.reasoning_budget == 64


@pytest.mark.parametrize("budget", [0, 1, 3, 7])
def test_the_budget_closes_the_thinking_after_exactly_its_tokens(opened: Engine, budget: int) -> None:
    _, finals, deltas = run_engine(opened, [chat("b", thinking_budget=budget), chat("free")])
    thought, answer = split(deltas["b"])
    free_thought, _ = split(deltas["free"])
    fin = finals["b"]
    assert fin.usage.reasoning_tokens == budget and fin.reasoning_budget == budget
    toks = opened.tok.tokenize(free_thought, add_special=False)
    assert free_thought.startswith(thought) and len(toks) >= budget
    assert answer.strip() and not answer.startswith(("</", "think", ">"))  # nothing of the forced close
    assert (thought == "") == (budget == 0)


def test_thinking_off_generates_none(opened: Engine, qwen: Engine) -> None:
    _, f1, d1 = run_engine(opened, [chat("off", think=False)])
    _, f2, d2 = run_engine(qwen, [chat("off", template_kwargs={"enable_thinking": False})])
    _, f3, d3 = run_engine(qwen, [chat("eff", reasoning_effort="none")])
    for d, f in ((d1["off"], f1["off"]), (d2["off"], f2["off"]), (d3["eff"], f3["eff"])):
        thought, answer = split(d)
        assert thought == "" and answer.strip() and f.usage.reasoning_tokens == 0


def test_a_schema_constrains_the_answer_not_the_thinking(opened: Engine) -> None:
    _, finals, deltas = run_engine(opened, [chat("s", json_schema=SCHEMA)])
    thought, answer = split(deltas["s"])
    assert thought == "5 plus 5 is 10."
    obj = json.loads(answer)  # the schema's shape (the number itself is the model's: 10 on one CPU, 10**15 on another)
    assert list(obj) == ["n"] and type(obj["n"]) is int and finals["s"].finish_reason == "stop"


def test_forced_tool_call_after_thinking(opened: Engine) -> None:
    schema = json.dumps({"type": "object", "properties": {"name": {"const": "add"}, "arguments": {
        "type": "object", "properties": {"a": {"type": "integer", "enum": [1, 2, 5, 10]}}, "required": ["a"]}},
        "required": ["name", "arguments"]})
    _, _, deltas = run_engine(opened, [chat("t", json_schema=schema, parse_tool_calls=True,
                                                 tools=[{"type": "function", "function": {"name": "add"}}])])
    thought, answer = split(deltas["t"])
    calls = [c for d in deltas["t"] for c in d.tool_calls]
    assert thought and answer == "" and [c.name for c in calls] == ["add"]
    assert "a" in json.loads(calls[0].arguments)


def test_the_worker_opens_the_thinking_when_the_template_does_not(qwen: Engine) -> None:
    _, finals, deltas = run_engine(qwen, [chat("q", thinking_budget=5)])
    thought, answer = split(deltas["q"])
    assert thought and answer.strip() and finals["q"].usage.reasoning_tokens == 5
    no_tag_in_any_piece(deltas["q"], ("<think>", "</think>"))


def test_harmony_channels_on_real_tokens(model_path: Path) -> None:
    for e in _engine(model_path, HARMONY):
        assert e.info.reasoning_format == "harmony"
        _, finals, deltas = run_engine(e, [chat("h", thinking_budget=4), chat("off", think=False)])
        thought, answer = split(deltas["h"])
        assert thought and answer.strip() and finals["h"].usage.reasoning_tokens == 4
        no_tag_in_any_piece(deltas["h"], ("<|channel|>", "<|message|>", "<|end|>", "<|start|>"))
        thought, answer = split(deltas["off"])
        assert thought == "" and answer.strip()


def test_bad_thinking_requests_are_refused(opened: Engine, engine: Engine) -> None:
    _, finals, _ = run_engine(opened, [chat("cap", thinking_budget=65), chat("neg", thinking_budget=-2),
                                       chat("lvl", reasoning_effort="extreme")])
    _, f2, _ = run_engine(engine, [wire.GenerateRequest(id="plain", messages=MSGS, think=True, params=G)])
    for f in (finals["cap"], finals["neg"], finals["lvl"], f2["plain"]):
        assert isinstance(f, wire.RequestFailed) and f.code == "invalid_request"
    assert "does not support thinking" in f2["plain"].message


def test_parallel_sampling_threads_give_the_same_split(model_path: Path) -> None:
    reqs = [chat("p0", thinking_budget=3), chat("p1", json_schema=SCHEMA), chat("p2")]
    for e in _engine(model_path, OPENED, reasoning_budget_max=64):  # fresh too: no prefix reused from other tests
        _, _, seq = run_engine(e, reqs)
    for e in _engine(model_path, OPENED, reasoning_budget_max=64, sampling_threads=3):
        _, _, par = run_engine(e, reqs)
        assert {k: split(v) for k, v in par.items()} == {k: split(v) for k, v in seq.items()}
