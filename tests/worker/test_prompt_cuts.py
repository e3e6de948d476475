"""A completion's prompt on a sliding-window model is decoded in the chunks llama-server
decodes it in (prefill.prompt_cuts: 4 + n_ubatch and 4 tokens before its end), so a request
alone gives llama-server's greedy tokens and logprobs: llama.cpp's CPU kernels round
differently with a batch's shape, and on the embedded Gemma 3 a prompt decoded in one batch
answers another text than llama-server 12 tokens in (bench/scenarios/throughput.py's greedy
check). Infill is not cut (llama-server cuts completion tasks only)."""

from __future__ import annotations

import math
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest

from corral import wire
from corral.worker.engine import Engine
from corral.worker.llama_context import context_params, model_params
from corral.worker.prefill import prompt_cuts

from testkit.gguf_models import write_fim_model

from .conftest import run_engine, settings_for

pytestmark = pytest.mark.integration

PROMPT = "The three most useful things to know about rivers are"  # 11 tokens with BOS
LONG = " ".join(f"Item {i} is a number that follows {i - 1}." for i in range(1, 55))  # 684 tokens


@pytest.fixture()
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every ``llama_decode`` the engine makes."""
    sizes: list[int] = []
    decode = ll.llama_decode

    def counted(ctx: ll.llama_context_p, batch: ll.llama_batch) -> int:
        sizes.append(batch.n_tokens)
        return int(decode(ctx, batch))

    monkeypatch.setattr(ll, "llama_decode", counted)
    return sizes


def _greedy(rid: str, prompt: str, **kw: object) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, logprobs=0, **kw,  # type: ignore[arg-type]
                                params=wire.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))


def test_a_prompt_is_decoded_in_llama_servers_chunks(model_path: Path, decodes: list[int]) -> None:
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=1024, threads=2))
    try:
        assert prompt_cuts(e.m) == (4 + 512, 4)
        for rid, prompt, chunks in (("short", PROMPT, [7, 4]), ("long", LONG, [684 - 516, 512, 4])):
            e.slots[0].cached.clear()  # no prefix kept from the request before
            decodes.clear()
            _, finals, _ = run_engine(e, [_greedy(rid, prompt)])
            fin = finals[rid]
            assert isinstance(fin, wire.Finished) and fin.usage.prompt_tokens == sum(chunks), fin
            assert decodes == [*chunks, 1], (rid, decodes)  # then the second token's decode
    finally:
        e.close()


def test_the_same_prompt_again_reuses_all_but_its_last_cut_and_answers_the_same(model_path: Path,
                                                                                decodes: list[int]) -> None:
    """A reused prefix stops where the last cut began: the last 4 tokens decode again in the
    batch shape they had, so the same greedy request gives the same tokens and logprobs
    (reused up to the last token alone, the logits came from a batch of 1 and could part)."""
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=1024, threads=2))
    try:
        runs = []
        for rid in ("first", "again"):
            decodes.clear()
            _, finals, deltas = run_engine(e, [_greedy(rid, PROMPT)])
            fin = finals[rid]
            assert isinstance(fin, wire.Finished)
            runs.append(([(lp.id, lp.logprob) for d in deltas[rid] for lp in d.logprobs], fin.usage.cached_tokens,
                         list(decodes)))
    finally:
        e.close()
    (first, cached0, dec0), (again, cached1, dec1) = runs
    assert (cached0, dec0[:2]) == (0, [7, 4]) and (cached1, dec1[0]) == (7, 4), runs
    assert again == first  # exactly: the same shapes, the same rounding


def test_the_cuts_give_the_logprob_of_llama_servers_chunks_not_of_one_batch(model_path: Path) -> None:
    """The first token's logprob is what llama.cpp gives for the prompt decoded as 7 + 4
    tokens (llama-server's chunks; it answered -1.0337 here), and the cut matters on this
    model: in one batch of 11 it is 0.05 away (-0.9789), which parts the greedy text later."""
    s = settings_for(model_path, n_parallel=1, ctx_len=1024, threads=2)
    e = Engine(s)
    try:
        _, _, deltas = run_engine(e, [_greedy("a", PROMPT)])
        first = next(lp for d in deltas["a"] for lp in d.logprobs)
        toks = e.tok.tokenize(PROMPT, add_special=True)
    finally:
        e.close()
    assert len(toks) == 11

    model = ll.llama_model_load_from_file(str(model_path).encode(), model_params(0))
    try:
        def logprob(chunks: list[int]) -> float:
            ctx = ll.llama_init_from_model(model, context_params(s, n_ctx=1024, n_batch=512, n_ubatch=512,
                                                                 n_seq_max=1, threads=2))
            b = ll.llama_batch_init(512, 0, 1)
            try:
                at = 0
                for size in chunks:
                    for j in range(size):
                        b.token[j], b.pos[j], b.n_seq_id[j] = toks[at + j], at + j, 1
                        b.seq_id[j][0] = 0
                        b.logits[j] = at + j == len(toks) - 1
                    b.n_tokens = size
                    assert ll.llama_decode(ctx, b) == 0
                    at += size
                logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, chunks[-1] - 1),
                                               shape=(ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model)),))
                x = logits.astype(np.float64)
                return float(x[first.id] - (x.max() + math.log(np.exp(x - x.max()).sum())))
            finally:
                ll.llama_batch_free(b)
                ll.llama_free(ctx)

        cut, whole = logprob([7, 4]), logprob([11])
    finally:
        ll.llama_model_free(model)
    assert math.isclose(first.logprob, cut, abs_tol=1e-5), (first.logprob, cut, whole)
    assert abs(whole - cut) > 0.01, (cut, whole)


def test_infill_is_not_cut(model_path: Path, tmp_path: Path, decodes: list[int]) -> None:
    fim = write_fim_model(model_path, tmp_path / "gemma-fim.gguf")
    e = Engine(settings_for(fim, n_parallel=1, ctx_len=1024, threads=2))
    try:
        req = wire.GenerateRequest(id="i", prompt="", infill=wire.Infill(prefix="def add(a, b):\n    return",
                                                                         suffix="\n"),
                                   params=wire.SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        _, finals, _ = run_engine(e, [req])
        fin = finals["i"]
        assert isinstance(fin, wire.Finished) and decodes[0] == fin.usage.prompt_tokens > 4, (decodes, fin)
    finally:
        e.close()
