"""A request that fails while it takes its slot (``Engine._start``) fails alone and
leaves nothing behind: its slot free with no sampler, its grammar freed, and the next
request runs in that slot (real engine and model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp as ll
import pytest

from corral import wire
from corral.worker import engine as engine_mod
from corral.worker import slots as slots_mod
from corral.worker.prompt import requests
from .conftest import run_engine, settings_for

SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


@pytest.fixture(scope="module")
def one_slot(model_path: Path) -> Iterator[Any]:
    e = engine_mod.Engine(settings_for(model_path, n_parallel=1, ctx_len=512))
    yield e
    e.close()


def _boom(*a: object, **kw: object) -> None:
    raise RuntimeError("boom")


def _gen(rid: str, **kw: Any) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt="Hello", params=wire.SamplingParams(max_tokens=3, temperature=0.0), **kw)


def test_a_start_that_fails_after_the_sampler_was_made_frees_it(one_slot: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots_mod, "slot_output", _boom)  # after the slot's sampler exists (slots.equip)
    _, finals, _ = run_engine(one_slot, [_gen("bad")])
    monkeypatch.undo()
    assert isinstance(finals["bad"], wire.RequestFailed) and finals["bad"].code == "internal"
    assert "boom" in finals["bad"].message
    (slot,) = one_slot.slots
    assert slot.job is None and slot.sampler is None and slot.out is None
    assert slot.cached == []
    texts, finals, _ = run_engine(one_slot, [_gen("next")])
    assert isinstance(finals["next"], wire.Finished) and texts["next"]


def test_a_start_that_fails_before_the_grammar_was_handed_over_frees_it(one_slot: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[object] = []
    freed: list[object] = []
    real_grammar, real_free = requests.grammar_sampler, ll.llama_sampler_free

    def grammar(*a: Any) -> object:
        g = real_grammar(*a)
        made.append(g)
        return g

    def free(smpl: Any) -> None:
        freed.append(smpl)
        real_free(smpl)

    monkeypatch.setattr(requests, "grammar_sampler", grammar)
    monkeypatch.setattr(ll, "llama_sampler_free", free)
    monkeypatch.setattr(engine_mod, "begin", _boom)  # before the slot's sampler takes the grammar
    _, finals, _ = run_engine(one_slot, [_gen("bad", json_schema=SCHEMA)])
    monkeypatch.undo()
    assert isinstance(finals["bad"], wire.RequestFailed) and finals["bad"].code == "internal"
    (g,) = made
    assert g is not None and any(f is g for f in freed)
    (slot,) = one_slot.slots
    assert slot.job is None and slot.sampler is None
    texts, finals, _ = run_engine(one_slot, [_gen("next", json_schema=SCHEMA)])
    assert isinstance(finals["next"], wire.Finished) and texts["next"]
