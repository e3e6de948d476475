"""Per-request sampling: llama.cpp sampler chains (run in C), grammar constraints and
token logprobs.

Chain order follows llama-server: logit bias (the request's ``logit_bias``, -inf on
end-of-generation tokens with ``ignore_eos``), penalties, then ``temperature <= 0``:
greedy, else top_k, top_p, min_p, temperature, dist(seed).

Two ways to sample a slot:

- plain (no grammar, ``SlotSampler``): the whole chain, in C, over the short candidate list of
  worker/sampling/candidates.py (top-k and greedy chains without penalties), else one
  ``llama_sampler_sample`` over the whole vocabulary.
- with a grammar (``GrammarSampler``): the way llama.cpp's common sampler does it.
  Sample WITHOUT the grammar first (over the short list where the chain allows), then
  ask the grammar about the chosen token only (one candidate: microseconds). Only if it
  is rejected, resample with the grammar over the model's 1024 most likely tokens (the
  bias/penalty stage, then top-1024, then the grammar, then the rest of the chain); if
  none of them is allowed, over the 16384 most likely; only then over the whole
  vocabulary. Where the short list serves, the top 64 are tried first, and decide when
  they hold the chain's k allowed tokens (1 for greedy): those are then the k best
  allowed of the top 1024 as well, so the pick is the same (the chain, and its random
  draw, runs only on the level that decides); the top-1024 level then comes from a short
  list too. Applying a grammar to Gemma's 262k tokens costs 20-30 ms; to 16384 about
  8 ms, to 1024 about 0.7 ms. Greedy decoding is exact (the best allowed token is among
  the top N whenever any allowed one is); sampling draws from the allowed tokens among
  the model's N most likely, like a top_k of N in front of the grammar (llama.cpp's
  common sampler resamples over the whole vocabulary instead).

Logprobs (only for requests that ask) are the log-softmax of the model's raw logits,
computed with numpy over a view of llama.cpp's logits buffer: ~0.3 ms per token for
the normalizer, ~0.1 ms for the top alternatives (a threshold below the max, widened
until enough tokens pass, then a sort of those few).
"""

from __future__ import annotations

import ctypes
import math
import random
import time
from collections.abc import Callable

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

from corral import wire
from corral.worker.sampling.candidates import MAX_K, ShortList

__all__ = ["make_sampler", "free_sampler", "resolve_seed", "SlotSampler", "GrammarSampler", "Sampler",
           "slot_sampler", "token_logprobs", "logits_at", "Logits", "BAN"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF
BAN = -100.0  # a logit_bias at or below this bans the token (-inf), as OpenAI documents
_RESAMPLE_TOPS = (1024, 16384)  # candidates a grammar resample tries before the whole vocabulary
_SHORT_RESAMPLE_TOPS = (64, 1024)  # the same from a short list (worker/sampling/candidates.py), 64 first
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def resolve_seed(params: wire.SamplingParams, default: int | None) -> int:
    seed = params.seed if params.seed is not None else default
    if seed is None or seed < 0:
        return random.getrandbits(32) if seed is None else LLAMA_DEFAULT_SEED
    return seed & 0xFFFFFFFF


def _new_chain() -> ll.llama_sampler_p:
    chain: ll.llama_sampler_p = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    return chain


def _add_pre(chain: ll.llama_sampler_p, p: wire.SamplingParams, n_vocab: int, eog_tokens: list[int]) -> bool:
    """Logit bias and penalties; True when any sampler was added."""
    add = ll.llama_sampler_chain_add
    bias: dict[int, float] = {t: (-math.inf if b <= BAN else b) for t, b in p.logit_bias.items()}
    if p.ignore_eos:
        for t in eog_tokens:
            bias[t] = -math.inf
    added = False
    if bias:
        arr = (ll.llama_logit_bias * len(bias))()
        for i, (t, b) in enumerate(bias.items()):
            arr[i] = ll.llama_logit_bias(t, b)
        add(chain, ll.llama_sampler_init_logit_bias(n_vocab, len(bias), arr))
        added = True
    if _has_penalties(p):
        last_n = n_vocab if p.repeat_last_n < 0 else p.repeat_last_n
        add(chain, ll.llama_sampler_init_penalties(n_vocab, last_n, p.repeat_penalty, p.frequency_penalty,
                                                   p.presence_penalty))
        added = True
    return added


def _has_penalties(p: wire.SamplingParams) -> bool:
    return (p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) \
        and p.repeat_last_n != 0


def _add_post(chain: ll.llama_sampler_p, p: wire.SamplingParams, seed: int) -> None:
    add = ll.llama_sampler_chain_add
    if p.temperature <= 0.0:
        add(chain, ll.llama_sampler_init_greedy())
        return
    if p.top_k > 0:
        add(chain, ll.llama_sampler_init_top_k(p.top_k))
    if 0.0 < p.top_p < 1.0:
        add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
    if p.min_p > 0.0:
        add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
    add(chain, ll.llama_sampler_init_temp(p.temperature))
    add(chain, ll.llama_sampler_init_dist(seed))


def _prime(chain: ll.llama_sampler_p, p: wire.SamplingParams, n_vocab: int, prompt_tail: list[int]) -> None:
    """Feed the last prompt tokens to the penalties (only they keep history)."""
    if _has_penalties(p):
        keep = n_vocab if p.repeat_last_n < 0 else p.repeat_last_n
        for t in prompt_tail[-keep:]:
            if t >= 0:  # an image's positions (negative pseudo-ids, worker/media/projector.py) are no tokens
                ll.llama_sampler_accept(chain, t)


def make_sampler(p: wire.SamplingParams, *, n_vocab: int, seed: int, eog_tokens: list[int],
                 prompt_tail: list[int]) -> ll.llama_sampler_p:
    """The whole chain in one (the plain path). ``prompt_tail`` primes the penalties."""
    chain = _new_chain()
    _add_pre(chain, p, n_vocab, eog_tokens)
    _add_post(chain, p, seed)
    _prime(chain, p, n_vocab, prompt_tail)
    return chain


def free_sampler(smpl: ll.llama_sampler_p | None) -> None:
    if smpl:
        ll.llama_sampler_free(smpl)


Logits = npt.NDArray[np.float32]


def logits_at(ctx: ll.llama_context_p, idx: int, n_vocab: int) -> Logits:
    """A numpy view (no copy) of the logits of batch position ``idx``; valid until the next decode."""
    ptr = ll.llama_get_logits_ith(ctx, idx)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,))


def token_logprobs(logits: Logits, token: int, k: int, piece: Callable[[int], bytes]) -> wire.TokenLogprob:
    """log-softmax of ``logits`` at ``token``, and the ``k`` most likely tokens."""
    mx = float(logits.max())
    lse = mx + math.log(float(np.exp(logits - mx).sum(dtype=np.float64)))
    top: list[wire.TopLogprob] = []
    if k > 0:
        thr = mx - 8.0
        while True:
            idx = np.flatnonzero(logits >= thr)
            if len(idx) >= k or thr < mx - 1e4:
                break
            thr -= 8.0
        best = idx[np.argsort(-logits[idx], kind="stable")[:k]]
        top = [wire.TopLogprob(piece(int(t)), float(logits[t]) - lse, int(t)) for t in best]
    return wire.TokenLogprob(piece(token), float(logits[token]) - lse, top, token)


def _short_list(p: wire.SamplingParams, n_vocab: int, eog_tokens: list[int], k: int | None = None) -> ShortList | None:
    """A short candidate list (worker/sampling/candidates.py) for chains that can use one: for the
    chain's own top-k, or for a top-``k`` in front of a grammar."""
    if _has_penalties(p) or not (p.temperature <= 0.0 or 0 < p.top_k <= MAX_K):
        return None
    touched = list(p.logit_bias) + (eog_tokens if p.ignore_eos else [])
    return ShortList(k or (1 if p.temperature <= 0.0 else p.top_k), touched, n_vocab)


class SlotSampler:
    """One request's sampling without a grammar: the whole chain, over the short list
    where it serves. ``sample`` returns the token."""

    def __init__(self, p: wire.SamplingParams, *, n_vocab: int, seed: int, eog_tokens: list[int],
                 prompt_tail: list[int]) -> None:
        self.n_vocab = n_vocab
        self.chain: ll.llama_sampler_p | None = make_sampler(p, n_vocab=n_vocab, seed=seed, eog_tokens=eog_tokens,
                                                             prompt_tail=prompt_tail)
        self.short = _short_list(p, n_vocab, eog_tokens)

    def free(self) -> None:
        free_sampler(self.chain)
        self.chain = None

    def sample(self, ctx: ll.llama_context_p, idx: int, is_eog: Callable[[int], bool]) -> int | None:
        if not self.chain:
            raise RuntimeError("this request's sampler was freed")
        if self.short is not None:
            tok = self.short.sample(self.chain, logits_at(ctx, idx, self.n_vocab))
            if tok is not None:
                return tok
        return int(ll.llama_sampler_sample(self.chain, ctx, idx))


class GrammarSampler:
    """One request's sampling with a grammar (the module's second way): it owns
    ``grammar`` from here on (freed with it, also when this constructor fails).
    ``sample`` returns the token, or None when the grammar allows nothing any more (the
    answer is complete: finish with "stop")."""

    def __init__(self, p: wire.SamplingParams, *, n_vocab: int, seed: int, eog_tokens: list[int],
                 prompt_tail: list[int], grammar: ll.llama_sampler_p) -> None:
        self.n_vocab = n_vocab
        self.grammar: ll.llama_sampler_p | None = grammar
        self.grammar_s = 0.0  # time spent in grammar work
        self.k = 1 if p.temperature <= 0.0 else p.top_k  # how many allowed tokens decide the chain's pick
        self.pre: ll.llama_sampler_p | None = None  # bias and penalties, if any
        self.chain: ll.llama_sampler_p | None = None  # the rest of the chain
        self.tops: list[ll.llama_sampler_p] = []  # top-N samplers of the _RESAMPLE_TOPS levels
        # grammar resamples from short lists: (N, its list, a top-N sampler)
        self.short_tops: list[tuple[int, ShortList, ll.llama_sampler_p]] = []
        try:
            self.pre = _new_chain()
            if not _add_pre(self.pre, p, n_vocab, eog_tokens):
                ll.llama_sampler_free(self.pre)
                self.pre = None
            else:
                _prime(self.pre, p, n_vocab, prompt_tail)
            self.chain = _new_chain()
            _add_post(self.chain, p, seed)
            self.short = _short_list(p, n_vocab, eog_tokens)
            self.tops = [ll.llama_sampler_init_top_k(k) for k in _RESAMPLE_TOPS]
            if self.short is not None:
                for n in _SHORT_RESAMPLE_TOPS:
                    sl = _short_list(p, n_vocab, eog_tokens, n)
                    assert sl is not None  # the same conditions as self.short
                    self.short_tops.append((n, sl, ll.llama_sampler_init_top_k(n)))
            # the candidate arrays the grammar levels fill: the whole vocabulary, and one token
            self.data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self.ids = np.arange(n_vocab, dtype=np.int32)
            self.cur = ll.llama_token_data_array(self.data.ctypes.data_as(ll.llama_token_data_p), n_vocab, -1,
                                                 False)
            self.one = np.zeros(1, dtype=_TOKEN_DATA)
            self.one_cur = ll.llama_token_data_array(self.one.ctypes.data_as(ll.llama_token_data_p), 1, -1, False)
        except BaseException:
            self.free()
            raise

    def free(self) -> None:
        """Idempotent: everything freed is set to None or emptied."""
        free_sampler(self.chain)
        self.chain = None
        free_sampler(self.pre)
        self.pre = None
        free_sampler(self.grammar)
        self.grammar = None
        for t in self.tops:
            free_sampler(t)
        self.tops = []
        for _, _, t in self.short_tops:
            free_sampler(t)
        self.short_tops = []

    def sample(self, ctx: ll.llama_context_p, idx: int, is_eog: Callable[[int], bool]) -> int | None:
        if not self.chain or not self.grammar:
            raise RuntimeError("this request's sampler was freed")
        logits = logits_at(ctx, idx, self.n_vocab)
        tok = None
        if self.short is not None:  # without the grammar first: the short list will do
            tok = self.short.pick((self.pre, self.chain) if self.pre else (self.chain,), logits)
        if tok is None:
            tok = self._apply(logits, grammar_first=False)
        t0 = time.perf_counter()
        if tok is None or not self._allowed(self.grammar, tok):
            tok = self._resample(logits)
        if tok is not None:
            if self.pre is not None:
                ll.llama_sampler_accept(self.pre, tok)
            ll.llama_sampler_accept(self.chain, tok)
            if not is_eog(tok):  # accepting an end token into a grammar aborts in llama.cpp
                ll.llama_sampler_accept(self.grammar, tok)
        self.grammar_s += time.perf_counter() - t0
        return tok

    def _fill(self, logits: Logits) -> None:
        d = self.data
        d["id"] = self.ids
        d["logit"] = logits
        d["p"] = 0.0
        c = self.cur
        c.size = self.n_vocab
        c.selected = -1
        c.sorted = False

    def _apply(self, logits: Logits, *, grammar_first: bool, top: ll.llama_sampler_p | None = None) -> int | None:
        """``_choose`` over the whole vocabulary."""
        self._fill(logits)
        return self._choose(self.data, self.cur, grammar_first=grammar_first, top=top)

    def _choose(self, data: npt.NDArray[np.void], cur: ll.llama_token_data_array, *, grammar_first: bool,
                top: ll.llama_sampler_p | None = None, need: int = 1) -> int | None:
        """Bias/penalties, [top-N], [grammar], then, if the grammar left at least ``need``
        candidates, the chain (its random draw only then): the selected token. None when
        this level does not decide: fewer than ``need`` allowed (over the whole vocabulary,
        with ``need`` 1: the grammar allows nothing)."""
        ref = ctypes.byref(cur)
        for smpl in (self.pre, top, self.grammar if grammar_first else None):
            if smpl is not None:
                ll.llama_sampler_apply(smpl, ref)
        if grammar_first and self._compact(data, cur) < need:
            return None
        ll.llama_sampler_apply(self.chain, ref)
        sel = cur.selected
        return int(data["id"][sel]) if 0 <= sel < cur.size else None

    @staticmethod
    def _compact(data: npt.NDArray[np.void], cur: ll.llama_token_data_array) -> int:
        """Keep only the candidates the grammar allows (in their order); how many."""
        view = data[: cur.size]
        keep = view[view["logit"] > -np.inf]
        if len(keep):
            data[: len(keep)] = keep
            cur.size = len(keep)
            cur.sorted = False
        return len(keep)

    def _allowed(self, grammar: ll.llama_sampler_p, tok: int) -> bool:
        one = self.one
        one["id"][0] = tok
        one["logit"][0] = 1.0
        one["p"][0] = 0.0
        self.one_cur.size = 1
        self.one_cur.selected = -1
        ll.llama_sampler_apply(grammar, ctypes.byref(self.one_cur))
        return bool(one["logit"][0] > -np.inf)

    def _resample(self, logits: Logits) -> int | None:
        """The chain's pick among the tokens the grammar allows, level by level; None: it
        allows none."""
        tried = 0  # the largest top-N already tried from a short list
        for n, sl, top in self.short_tops:
            # the top-64 decides only when it holds k allowed tokens: then they are the k
            # best allowed among the top 1024 too, and the chain picks what it would there
            need = 1 if n >= _RESAMPLE_TOPS[0] else self.k
            if need > n:
                continue
            if not sl.load(logits):
                break
            tried = n
            tok = self._choose(sl.data, sl.cur, grammar_first=True, top=top, need=need)
            if tok is not None:
                return tok
        for n, top in zip(_RESAMPLE_TOPS, self.tops):
            if n <= tried:
                continue
            tok = self._apply(logits, grammar_first=True, top=top)
            if tok is not None:
                return tok
        return self._apply(logits, grammar_first=True)


Sampler = SlotSampler | GrammarSampler


def slot_sampler(p: wire.SamplingParams, *, n_vocab: int, seed: int, eog_tokens: list[int], prompt_tail: list[int],
                 grammar: ll.llama_sampler_p | None = None) -> Sampler:
    """A request's sampler: plain, or constrained by ``grammar`` (which it then owns)."""
    if grammar is None:
        return SlotSampler(p, n_vocab=n_vocab, seed=seed, eog_tokens=eog_tokens, prompt_tail=prompt_tail)
    return GrammarSampler(p, n_vocab=n_vocab, seed=seed, eog_tokens=eog_tokens, prompt_tail=prompt_tail,
                          grammar=grammar)
