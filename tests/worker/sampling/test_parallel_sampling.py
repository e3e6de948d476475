"""Slots sampled on several threads give what sequential sampling gives (real model).

Two engines with the same settings but ``sampling_threads`` 1 and 4 run the same
requests in the same steps; every message (text, token counts, logprobs, tool calls,
finish reasons, stop strings) must be the same, in the same order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import wire
from corral.worker.engine import Engine

from worker.conftest import settings_for

pytestmark = pytest.mark.integration

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                      "age": {"type": "integer"}},
                     "required": ["name", "age"]})
TOOL_SCHEMA = json.dumps({"type": "object", "properties": {"name": {"const": "get_weather"},
                                                           "arguments": {"type": "object", "properties": {
                                                               "city": {"type": "string", "maxLength": 10}},
                                                               "required": ["city"]}},
                          "required": ["name", "arguments"]})


def workload() -> list[wire.GenerateRequest]:
    """Every kind of slot at once: greedy, seeded, n=3 (derived seeds), a JSON schema
    (greedy and seeded), logprobs, stop strings, penalties, a forced tool call."""
    P = wire.SamplingParams
    prompt = "The history of the Roman empire begins"
    reqs = [
        wire.GenerateRequest(id="greedy", prompt=prompt, params=P(max_tokens=20, temperature=0.0)),
        wire.GenerateRequest(id="seeded", prompt="Once upon a time", params=P(max_tokens=20, temperature=1.0,
                                                                              top_k=40, top_p=0.95, seed=7)),
        wire.GenerateRequest(id="schema", prompt="A person as JSON:", json_schema=SCHEMA,
                             params=P(max_tokens=30, temperature=0.0)),
        wire.GenerateRequest(id="schema-seeded", prompt="Another person as JSON:", json_schema=SCHEMA,
                             params=P(max_tokens=30, temperature=0.9, seed=3)),
        wire.GenerateRequest(id="logprobs", prompt=prompt, logprobs=3,
                             params=P(max_tokens=12, temperature=0.8, seed=11)),
        wire.GenerateRequest(id="stop", prompt="Count: one, two, three,", params=P(max_tokens=24, temperature=0.0,
                                                                                   stop=[" six", "\n"])),
        wire.GenerateRequest(id="penalties", prompt="Repeat after me: la la la", params=P(
            max_tokens=20, temperature=0.7, seed=5, repeat_penalty=1.3, presence_penalty=0.5)),
        wire.GenerateRequest(id="tool", prompt="Call the weather tool for Paris:", json_schema=TOOL_SCHEMA,
                             parse_tool_calls=True, params=P(max_tokens=30, temperature=0.0)),
    ]
    reqs += [wire.GenerateRequest(id=f"n{i}", prompt="My favourite colour is",
                                  params=P(max_tokens=16, temperature=1.0, seed=100 + i)) for i in range(3)]
    return reqs


def comparable(m: object) -> Any:
    """A message without its timings (those differ run to run)."""
    if isinstance(m, wire.Finished):
        return ("finished", m.id, m.finish_reason, m.usage, m.slot, m.stop_string)
    if isinstance(m, wire.Delta):
        return ("delta", m.id, m.text, m.n_tokens, m.logprobs, [(c.name, c.arguments) for c in m.tool_calls])
    return m


def run_steps(engine: Engine, reqs: list[wire.GenerateRequest], *, max_steps: int = 2000) -> list[list[Any]]:
    """Submit everything at once and return each step's messages, comparable."""
    for r in reqs:
        engine.submit(r)
    steps = []
    for _ in range(max_steps):
        steps.append([comparable(m) for m in engine.step()])
        if not engine.has_work:
            return steps
    raise AssertionError("the engine did not become idle")


@pytest.fixture(scope="module")
def engines(model_path: Path) -> Iterator[tuple[Engine, Engine]]:
    seq = Engine(settings_for(model_path, n_parallel=12, ctx_len=12 * 256, sampling_threads=1))
    par = Engine(settings_for(model_path, n_parallel=12, ctx_len=12 * 256, sampling_threads=4))
    yield seq, par
    seq.close()
    par.close()


def spy_threads(engine: Engine) -> set[str]:
    """Record the threads that ran the engine's draws."""
    names: set[str] = set()
    draw = engine._draw

    def spied(item: Any) -> Any:
        names.add(threading.current_thread().name)
        return draw(item)

    setattr(engine, "_draw", spied)  # the step looks the method up on each call
    return names


def test_parallel_draws_give_the_sequential_messages(engines: tuple[Engine, Engine]) -> None:
    seq, par = engines
    assert seq.pool.n == 1 and par.pool.n == 4
    threads = spy_threads(par)
    want = run_steps(seq, workload())
    got = run_steps(par, workload())
    assert got == want
    assert any(name.startswith("corral-sample") for name in threads)  # the pool did draw
    flat = [m for step in want for m in step]
    finished = {m[1]: m for m in flat if m[0] == "finished"}
    assert len(finished) == len(workload())
    texts = {rid: "".join(m[2] for m in flat if m[0] == "delta" and m[1] == rid) for rid in finished}
    assert json.loads(texts["schema"]).keys() == {"name", "age"}
    assert finished["stop"][2] == "stop" and finished["stop"][5] in (" six", "\n")
    assert any(m[5] for m in flat if m[0] == "delta" and m[1] == "tool")  # a parsed call
    assert sum(len(m[4]) for m in flat if m[0] == "delta" and m[1] == "logprobs") == 12
    assert len({texts["n0"], texts["n1"], texts["n2"]}) > 1  # seeds matter, per slot


def run_with_a_broken_slot(engine: Engine, reqs: list[wire.GenerateRequest]) -> list[list[Any]]:
    """Run ``reqs``; the sampler of request "bad" raises from its second token on."""
    for r in reqs:
        engine.submit(r)
    steps = [[comparable(m) for m in engine.step()]]  # all start together: prefill + first tokens
    slot = next(s for s in engine.slots if s.job is not None and s.job.req.id == "bad")
    assert slot.sampler is not None

    def broken(*_: Any) -> int:
        raise RuntimeError("sampler exploded")

    setattr(slot.sampler, "sample", broken)
    while engine.has_work:
        steps.append([comparable(m) for m in engine.step()])
    assert slot.job is None and not slot.cached  # freed and cleared
    return steps


def test_a_failing_draw_fails_only_its_request(engines: tuple[Engine, Engine]) -> None:
    seq, par = engines
    bad = wire.GenerateRequest(id="bad", prompt="This one breaks", params=wire.SamplingParams(max_tokens=20,
                                                                                       temperature=0.0))
    reqs = [bad] + [r for r in workload() if r.id != "tool"]
    want = run_with_a_broken_slot(seq, reqs)
    got = run_with_a_broken_slot(par, reqs)
    assert got == want
    flat = [m for step in got for m in step]
    failed = [m for m in flat if isinstance(m, wire.RequestFailed)]
    assert [(f.id, f.code) for f in failed] == [("bad", "internal")]
    assert "sampler exploded" in failed[0].message
    finished = {m[1]: m[2] for m in flat if isinstance(m, tuple) and m[0] == "finished"}
    assert set(finished) == {r.id for r in reqs[1:]} and set(finished.values()) <= {"length", "stop"}
    again = run_steps(par, [wire.GenerateRequest(id="after", prompt="Hello", params=wire.SamplingParams(
        max_tokens=4, temperature=0.0))])
    assert any(m[0] == "finished" and m[2] == "length" for step in again for m in step)
