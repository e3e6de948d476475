"""The short candidate list (worker/sampling/candidates.py) draws exactly what the full chain draws.

Each case runs two copies of one sampler chain with the same seed over the same logits:
one through llama.cpp's full path (every token in the candidate array, as
``llama_sampler_sample`` builds it), one through ``SlotSampler``'s short list. The tokens
must be identical, draw for draw, and the short list must really have served them."""

from __future__ import annotations

import ctypes
import math

import llama_cpp as ll
import numpy as np
import pytest

from corral import wire
from corral.worker.sampling.candidates import MAX_K, MAX_SHORT, ShortList
from corral.worker.sampling.sampler import GrammarSampler, SlotSampler, make_sampler

N_VOCAB = 50_000
EOG = [1, 106, 212]
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def full_draw(chain: ll.llama_sampler_p, logits: np.ndarray) -> int:
    """What llama_sampler_sample does: every token, in id order, then the chain, then accept."""
    data = np.zeros(len(logits), dtype=TOKEN_DATA)
    data["id"] = np.arange(len(logits), dtype=np.int32)
    data["logit"] = logits
    cur = ll.llama_token_data_array(data.ctypes.data_as(ll.llama_token_data_p), len(logits), -1, False)
    ll.llama_sampler_apply(chain, ctypes.byref(cur))
    tok = int(data["id"][cur.selected])
    ll.llama_sampler_accept(chain, tok)
    return tok


def logits_stream(seed: int, n: int) -> list[np.ndarray]:
    """Shapes like a language model's: a few strong tokens over a broad low floor; some flat,
    some peaked."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(0.0, 3.0, N_VOCAB).astype(np.float32)
        strong = rng.choice(N_VOCAB, 30, replace=False)
        x[strong] += rng.uniform(5.0, 20.0 if i % 3 else 40.0, 30).astype(np.float32)
        out.append(x)
    return out


CASES = {
    "default": wire.SamplingParams(),
    "ignore_eos": wire.SamplingParams(ignore_eos=True),
    "top_k_1": wire.SamplingParams(top_k=1),
    "top_k_5000": wire.SamplingParams(top_k=5000, top_p=1.0, min_p=0.0),  # a large k: a ranked first guess
    "hot": wire.SamplingParams(temperature=1.7, top_p=0.5, min_p=0.0),
    "greedy": wire.SamplingParams(temperature=0.0),
    "boost_a_low_token": wire.SamplingParams(logit_bias={777: 24.0}),
    "greedy_ban_the_best": wire.SamplingParams(temperature=0.0, logit_bias={5: -100.0}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_short_list_draws_what_the_full_chain_draws(name: str) -> None:
    p = CASES[name]
    stream = logits_stream(1, 60)
    if name == "greedy_ban_the_best":
        for x in stream:
            x[5] = x.max() + 5.0  # the best token, banned: greedy must take the second
    if name == "ignore_eos":
        for x in stream:
            x[EOG[1]] = x.max() + 1.0
    draws: dict[str, list[int]] = {}
    for seed in (3, 4):
        full = make_sampler(p.values(), n_vocab=N_VOCAB, seed=seed, eog_tokens=EOG, prompt_tail=[])
        short = SlotSampler(p.values(), n_vocab=N_VOCAB, seed=seed, eog_tokens=EOG, prompt_tail=[])
        try:
            assert short.short is not None and short.chain is not None
            a = [full_draw(full, x) for x in stream]
            b = [short.short.sample(short.chain, x) for x in stream]
            assert a == b
            assert short.short.loads == len(stream)
            draws[str(seed)] = a
        finally:
            ll.llama_sampler_free(full)
            short.free()
    if name == "greedy_ban_the_best":
        assert 5 not in draws["3"]
    if name == "boost_a_low_token":
        assert 777 in draws["3"]
    if name == "ignore_eos":
        assert not set(draws["3"]) & set(EOG)
    if p.values().temperature > 0 and name != "top_k_1":
        assert draws["3"] != draws["4"], "different seeds should draw differently"


def test_greedy_ties_go_to_the_lowest_id_like_the_full_chain() -> None:
    x = np.zeros(N_VOCAB, dtype=np.float32)
    x[[900, 17, 4000]] = 9.0
    p = wire.SamplingParams(temperature=0.0)
    full = make_sampler(p.values(), n_vocab=N_VOCAB, seed=1, eog_tokens=EOG, prompt_tail=[])
    short = SlotSampler(p.values(), n_vocab=N_VOCAB, seed=1, eog_tokens=EOG, prompt_tail=[])
    try:
        assert short.short is not None and short.chain is not None
        assert short.short.sample(short.chain, x) == full_draw(full, x) == 17
    finally:
        ll.llama_sampler_free(full)
        short.free()


@pytest.mark.parametrize("p", [wire.SamplingParams(repeat_penalty=1.3),
                               wire.SamplingParams(top_k=0),
                               wire.SamplingParams(top_k=MAX_K + 1),
                               wire.SamplingParams(presence_penalty=0.5)])
def test_chains_that_need_every_token_take_the_full_path(p: wire.SamplingParams) -> None:
    s = SlotSampler(p.values(), n_vocab=N_VOCAB, seed=1, eog_tokens=EOG, prompt_tail=[5, 6])
    try:
        assert s.short is None
    finally:
        s.free()


def test_flat_logits_fall_back_and_a_slot_stops_trying() -> None:
    x = np.zeros(N_VOCAB, dtype=np.float32)  # every token ties: more than MAX_SHORT
    assert N_VOCAB > MAX_SHORT
    chain = make_sampler(wire.SamplingParams().values(), n_vocab=N_VOCAB, seed=1, eog_tokens=EOG, prompt_tail=[])
    try:
        sl = ShortList(40, [], N_VOCAB)
        assert sl.sample(chain, x) is None
        assert sl.loads == 0
        for _ in range(5):  # after a few misses in a row it stops trying
            assert sl.sample(chain, x) is None
        assert sl.misses == 3
        assert sl.sample(chain, logits_stream(2, 1)[0]) is None
    finally:
        ll.llama_sampler_free(chain)


def test_an_infinite_logit_takes_the_full_path_without_moving_the_chain() -> None:
    x, y = logits_stream(5, 2)
    x[10] = math.inf  # not one of the sampled logits (every stride-th)
    sl = ShortList(40, [], N_VOCAB)
    assert 10 % sl.stride != 0
    a = make_sampler(wire.SamplingParams().values(), n_vocab=N_VOCAB, seed=9, eog_tokens=EOG, prompt_tail=[])
    b = make_sampler(wire.SamplingParams().values(), n_vocab=N_VOCAB, seed=9, eog_tokens=EOG, prompt_tail=[])
    try:
        assert sl.sample(a, x) is None
        assert sl.loads == 0
        assert full_draw(a, y) == full_draw(b, y)  # the random state did not move
        assert sl.sample(a, y) == full_draw(b, y)
    finally:
        ll.llama_sampler_free(a)
        ll.llama_sampler_free(b)


def test_a_nan_logit_is_never_drawn() -> None:
    sl = ShortList(40, [], N_VOCAB)
    chain = make_sampler(wire.SamplingParams(temperature=1.5, top_p=1.0, min_p=0.0).values(), n_vocab=N_VOCAB, seed=2,
                         eog_tokens=EOG, prompt_tail=[])
    try:
        drawn = []
        for x in logits_stream(6, 40):
            x[10] = math.nan
            drawn.append(sl.sample(chain, x))
        assert None not in drawn and 10 not in drawn
    finally:
        ll.llama_sampler_free(chain)


def test_a_real_model_generates_the_same_text_with_and_without_the_short_list(
        model_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """End to end on the engine: seeded sampling, greedy, a logit bias, ignore_eos and a
    JSON schema (whose first draw per token uses the short list) give the same text when
    every draw takes the full path instead."""
    from corral.worker.sampling import sampler as sampling
    from corral.worker.engine import Engine

    from worker.conftest import run_engine, settings_for

    def reqs() -> list[wire.GenerateRequest]:
        return [
            wire.GenerateRequest(id="seeded", prompt="The old lighthouse keeper",
                                 params=wire.SamplingParams(max_tokens=40, seed=11)),
            wire.GenerateRequest(id="greedy", prompt="A recipe for bread:",
                                 params=wire.SamplingParams(max_tokens=40, temperature=0.0)),
            wire.GenerateRequest(id="biased", prompt="My favourite colour is",
                                 params=wire.SamplingParams(max_tokens=30, seed=3, ignore_eos=True,
                                                            logit_bias={236761: -100.0, 1437: 5.0})),
            wire.GenerateRequest(id="schema", prompt="A person as JSON:", json_schema=SCHEMA,
                                 params=wire.SamplingParams(max_tokens=40, seed=5)),
            # hot, with no top-p/min-p cut: every one of the k allowed tokens can be drawn, so
            # a resample level that decided with fewer than k would show
            wire.GenerateRequest(id="schema_hot", prompt="Someone as JSON:", json_schema=SCHEMA,
                                 params=wire.SamplingParams(max_tokens=40, seed=8, temperature=1.5, top_p=1.0,
                                                            min_p=0.0)),
            wire.GenerateRequest(id="schema_greedy", prompt="One more person as JSON:", json_schema=SCHEMA,
                                 params=wire.SamplingParams(max_tokens=40, temperature=0.0)),
            # a grammar with a logit bias: the short list runs the bias chain, then the rest
            wire.GenerateRequest(id="schema_biased", prompt="Another person as JSON:", json_schema=SCHEMA,
                                 params=wire.SamplingParams(max_tokens=40, seed=6, ignore_eos=True,
                                                            logit_bias={1437: 3.0, 236761: -100.0})),
        ]

    made: list[ShortList] = []
    real = sampling._short_list

    def recorded(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        sl = real(*a, **kw)
        made.extend([sl] if sl is not None else [])
        return sl

    e = Engine(settings_for(model_path, n_parallel=7, ctx_len=7 * 512))
    try:
        monkeypatch.setattr(sampling, "_short_list", recorded)
        short_texts, _, _ = run_engine(e, reqs())
        # the second run from empty caches too: a reused prefix changes the batches, and
        # with them the logits (enough to flip a seeded draw)
        for slot in e.slots:
            e._clear_slot(slot)
        monkeypatch.setattr(sampling, "_short_list", lambda *a, **kw: None)
        full_texts, _, _ = run_engine(e, reqs())
    finally:
        e.close()
    draws = [sl for sl in made if sl.k not in (64, 1024)]  # one per request; the others: grammar resamples
    assert len(draws) == 7 and all(sl.loads > 0 for sl in draws)  # every request used its list
    assert any(sl.loads > 0 for sl in made if sl.k == 64)  # and the grammar requests resampled from one
    assert short_texts == full_texts
    assert all(short_texts[k] for k in ("seeded", "greedy", "biased", "schema", "schema_greedy", "schema_biased"))
    assert short_texts["schema"].lstrip().startswith("{")
    assert short_texts["schema_biased"].lstrip().startswith("{")


SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}'


def test_the_top_64_decides_a_resample_only_with_k_allowed_tokens(model_path) -> None:  # noqa: ANN001
    """The 63 most likely tokens break the grammar, the 64th keeps it, and 60 more it
    allows lie just below: the top-1024 level draws among the best 40 allowed (top_k 40),
    so the top 64 (one allowed token) must not decide. Same draws as the full path."""
    import re

    mparams = ll.llama_model_default_params()
    mparams.vocab_only = True
    model = ll.llama_model_load_from_file(str(model_path).encode(), mparams)
    assert model
    try:
        vocab = ll.llama_model_get_vocab(model)
        n_vocab = ll.llama_vocab_n_tokens(vocab)
        texts = {t: (ll.llama_vocab_get_text(vocab, t) or b"") for t in range(n_vocab)}
        lower = [t for t, b in texts.items() if re.fullmatch(rb"[a-z]{3,8}", b)]
        upper = [t for t, b in texts.items() if re.fullmatch(rb"[A-Z]{3,8}", b)]
        logits = np.full(n_vocab, -20.0, dtype=np.float32)
        logits[upper[:63]] = 10.0
        logits[lower[0]] = 9.0
        logits[lower[1:61]] = 8.0
        p = wire.SamplingParams(temperature=1.0, top_p=1.0, min_p=0.0, top_k=40)
        drawn: dict[str, list[int]] = {}
        for path in ("short", "full"):
            for seed in range(12):
                s = GrammarSampler(p.values(), n_vocab=n_vocab, seed=seed, eog_tokens=EOG, prompt_tail=[],
                                   grammar=ll.llama_sampler_init_grammar(vocab, b"root ::= [a-z]+", b"root"))
                levels = s.short_tops
                try:
                    assert levels
                    if path == "full":
                        s.short_tops = []
                    drawn.setdefault(path, []).append(s._resample(logits))
                finally:
                    s.short_tops = levels  # freed with the rest
                    s.free()
    finally:
        ll.llama_model_free(model)
    assert drawn["short"] == drawn["full"]
    assert set(drawn["short"]) - {lower[0]}  # the 60 just below were drawn too
    assert set(drawn["short"]) <= set(lower[:61])
