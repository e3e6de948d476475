"""Per-request sampler chains (llama.cpp samplers, run in C).

Order follows llama-server: penalties, top_k, top_p, min_p, temperature, dist(seed).
``temperature <= 0`` means greedy (after penalties). ``ignore_eos`` adds a logit bias of
-inf on every end-of-generation token so they are never sampled.
"""

from __future__ import annotations

import random

import llama_cpp as ll

from corral import wire

__all__ = ["make_sampler", "free_sampler", "resolve_seed"]

LLAMA_DEFAULT_SEED = 0xFFFFFFFF


def resolve_seed(params: wire.SamplingParams, default: int | None) -> int:
    seed = params.seed if params.seed is not None else default
    if seed is None or seed < 0:
        return random.getrandbits(32) if seed is None else LLAMA_DEFAULT_SEED
    return seed & 0xFFFFFFFF


def make_sampler(
    p: wire.SamplingParams,
    *,
    n_vocab: int,
    seed: int,
    eog_tokens: list[int],
    prompt_tail: list[int],
) -> ll.llama_sampler_p:
    """Build the chain. ``prompt_tail`` (the last prompt tokens) primes the penalties."""
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    add = ll.llama_sampler_chain_add
    if p.ignore_eos and eog_tokens:
        arr = (ll.llama_logit_bias * len(eog_tokens))()
        for i, t in enumerate(eog_tokens):
            arr[i].token = t
            arr[i].bias = float("-inf")
        add(chain, ll.llama_sampler_init_logit_bias(n_vocab, len(eog_tokens), arr))
    penalties = (
        p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
    ) and p.repeat_last_n != 0
    if penalties:
        last_n = n_vocab if p.repeat_last_n < 0 else p.repeat_last_n
        add(
            chain,
            ll.llama_sampler_init_penalties(
                n_vocab, last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
            ),
        )
    if p.temperature <= 0.0:
        add(chain, ll.llama_sampler_init_greedy())
    else:
        if p.top_k > 0:
            add(chain, ll.llama_sampler_init_top_k(p.top_k))
        if 0.0 < p.top_p < 1.0:
            add(chain, ll.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            add(chain, ll.llama_sampler_init_min_p(p.min_p, 1))
        add(chain, ll.llama_sampler_init_temp(p.temperature))
        add(chain, ll.llama_sampler_init_dist(seed))
    if penalties:
        # The chain's accept feeds every sampler; only penalties keep history.
        keep = n_vocab if p.repeat_last_n < 0 else p.repeat_last_n
        for t in prompt_tail[-keep:]:
            ll.llama_sampler_accept(chain, t)
    return chain


def free_sampler(smpl: ll.llama_sampler_p | None) -> None:
    if smpl:
        ll.llama_sampler_free(smpl)

