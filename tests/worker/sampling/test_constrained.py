"""The engine's sampling step with grammars, logprobs, logit_bias and token prompts (real model)."""

from __future__ import annotations

import json
import math

from corral import wire
from corral.worker.engine import Engine

from worker.conftest import run_engine

G = wire.SamplingParams(max_tokens=6, temperature=0.0)


def req(rid: str, prompt: str = "Once upon a time", **kw: object) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, **kw)  # type: ignore[arg-type]


def test_grammar_forces_what_the_model_would_not_say(engine: Engine) -> None:
    texts, finals, _ = run_engine(engine, [
        req("digits", grammar="root ::= [0-9]+", params=G),
        req("exact", grammar='root ::= "zebra crossing"', params=wire.SamplingParams(max_tokens=20, temperature=0.9,
                                                                                        seed=1)),
        req("free", params=G),
    ])
    assert texts["digits"].isdigit() and len(texts["digits"]) >= 1
    assert finals["digits"].finish_reason == "length"
    assert texts["exact"] == "zebra crossing" and finals["exact"].finish_reason == "stop"
    assert finals["exact"].timings.grammar_ms > 0 and finals["free"].timings.grammar_ms == 0
    assert not texts["free"].strip().isdigit()


def test_grammar_agrees_with_greedy_when_it_allows_the_greedy_text(engine: Engine) -> None:
    texts, _, _ = run_engine(engine, [req("free", params=wire.SamplingParams(max_tokens=6, temperature=0.0,
                                                                             ignore_eos=True))])
    free = texts["free"]
    literal = json.dumps(free)  # a GBNF string literal: JSON escaping is compatible
    texts, finals, _ = run_engine(engine, [req("same", grammar=f"root ::= {literal} [a-z ]*", params=G)])
    assert texts["same"] == free  # checked token by token: never resampled


def test_logprobs_and_logit_bias(engine: Engine) -> None:
    _, _, deltas = run_engine(engine, [req("lp", logprobs=4, params=G)])
    lps = [lp for d in deltas["lp"] for lp in d.logprobs]
    assert len(lps) == 6
    for lp in lps:
        assert lp.top[0].id == lp.id and math.isclose(lp.top[0].logprob, lp.logprob)
        assert [a.logprob for a in lp.top] == sorted((a.logprob for a in lp.top), reverse=True)
        assert sum(math.exp(a.logprob) for a in lp.top) <= 1.0 + 1e-6
    first = lps[0]
    banned = wire.SamplingParams(max_tokens=1, temperature=0.0, logit_bias={first.id: -100.0})
    _, _, d2 = run_engine(engine, [req("ban", logprobs=1, params=banned)])
    assert d2["ban"][0].logprobs[0].id == first.top[1].id  # the runner-up


def test_bad_fields_are_refused_on_submit(engine: Engine) -> None:
    n_vocab = engine.m.n_vocab
    _, finals, _ = run_engine(engine, [
        req("bias", params=wire.SamplingParams(logit_bias={n_vocab: 1.0})),
        wire.GenerateRequest(id="toks", prompt_tokens=[1, n_vocab + 5]),
        req("schema", json_schema='{"type": "object", "properties": {"p": {"type": "string", "pattern": "(?=x)"}}}'),
        req("gbnf", grammar="root ::= ("),
        req("lp", logprobs=21),
        req("both", grammar='root ::= "a"', json_schema="{}"),
    ])
    for rid in ("bias", "toks", "schema", "gbnf", "lp", "both"):
        assert isinstance(finals[rid], wire.RequestFailed) and finals[rid].code == "invalid_request", rid
    assert not engine.has_work and not engine.waiting


def test_token_prompt_equals_text_prompt(engine: Engine) -> None:
    tokens = engine.tok.tokenize("Once upon a time", add_special=True)
    texts, finals, _ = run_engine(engine, [wire.GenerateRequest(id="toks", prompt_tokens=tokens, params=G)])
    # (the text is not compared with the text prompt's: a reused cached prefix may round differently)
    assert texts["toks"] and finals["toks"].usage.prompt_tokens == len(tokens)
    assert finals["toks"].usage.completion_tokens == 6


def test_odd_grammars_end_cleanly_and_never_crash_the_worker(engine: Engine) -> None:
    forever = wire.SamplingParams(max_tokens=5, temperature=0.7, seed=2, ignore_eos=True)
    texts, finals, _ = run_engine(engine, [
        req("empty", grammar='root ::= ""', params=G),  # only the end is allowed
        req("empty-no-eos", grammar='root ::= ""', params=forever),  # ...and the end is banned
        req("done-no-eos", grammar='root ::= "ok"', params=forever),
        req("left-recursive", grammar='root ::= root "a"', params=G),
        req("star", grammar='root ::= "a"*', params=forever),
    ])
    assert finals["empty"].finish_reason == "stop" and texts.get("empty", "") == ""
    assert finals["empty-no-eos"].finish_reason == "stop"
    assert texts["done-no-eos"] == "ok" and finals["done-no-eos"].finish_reason == "stop"
    assert isinstance(finals["left-recursive"], wire.RequestFailed)
    assert set(texts["star"]) <= {"a"} and finals["star"].finish_reason == "length"
    texts, finals, _ = run_engine(engine, [req("after", params=G)])  # the engine goes on
    assert finals["after"].finish_reason in ("stop", "length") and texts["after"]
