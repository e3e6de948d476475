"""Logprobs, echo, n, logit_bias, prompt lists and token arrays, /tokenize and /detokenize,
through the official openai client with real workers and the embedded model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import openai
import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration


async def _start(harness: Harness, model_path: Path) -> openai.AsyncOpenAI:
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 2048, "n_parallel": 4, "threads": 1}},
                         worker_command=None)
    await harness.start(cfg)
    return openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)


def _check_alternatives(chosen_logprob: float, tops: list[float]) -> None:
    assert tops == sorted(tops, reverse=True)
    assert all(x <= 0.0 for x in tops) and chosen_logprob <= 0.0
    assert sum(math.exp(x) for x in tops) <= 1.0 + 1e-6


async def test_chat_logprobs(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path)
    msgs = [{"role": "user", "content": "Count from one to five."}]
    r = await client.chat.completions.create(model="gemma", messages=msgs, max_tokens=8, temperature=0,
                                             logprobs=True, top_logprobs=5, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 5
        # greedy: the chosen token is the most likely one
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
        _check_alternatives(t.logprob, [a.logprob for a in t.top_logprobs])

    # streamed: the same tokens and values, spread over the chunks
    streamed: list[Any] = []
    async for chunk in await client.chat.completions.create(
            model="gemma", messages=msgs, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5,
            stream=True, extra_body={"ignore_eos": True}):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                streamed += ch.logprobs.content
    # The same tokens; the values within the noise of a reused prefix: the second request
    # reuses the first one's KV and recomputes only its last prompt token, in a batch of one,
    # and llama.cpp's CPU kernels give slightly different logits for a batch of one than for
    # the whole prompt (seen on an AVX-512 machine: up to 0.07 apart, e.g. -1.208 against -1.145; equal to 4
    # decimals on the machines before it).
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(math.isclose(s.logprob, c.logprob, abs_tol=0.1) for s, c in zip(streamed, content)), \
        [(s.logprob, c.logprob) for s, c in zip(streamed, content)]

    # logprobs without alternatives; a sampled token's logprob is still the model's
    r = await client.chat.completions.create(model="gemma", messages=msgs, max_tokens=4, temperature=1.0, seed=5,
                                             logprobs=True)
    assert all(t.top_logprobs == [] and t.logprob <= 0 for t in r.choices[0].logprobs.content)
    r = await client.chat.completions.create(model="gemma", messages=msgs, max_tokens=4)
    assert r.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError) as ei:
        await client.chat.completions.create(model="gemma", messages=msgs, top_logprobs=2)
    assert ei.value.param == "top_logprobs"
    await client.close()


async def test_completions_echo_logprobs_for_scoring(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path)
    prompt = "The quick brown fox jumps over the lazy dog"
    r = await client.completions.create(model="gemma", prompt=prompt, max_tokens=0, echo=True, logprobs=3)
    ch = r.choices[0]
    assert ch.text == prompt and r.usage.completion_tokens == 0
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.prompt_tokens  # one per prompt token (BOS too)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    for chosen, tops in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert len(tops) == 3
        _check_alternatives(chosen, list(tops.values()))
        assert chosen <= max(tops.values()) + 1e-6
    assert lp.text_offset == sorted(lp.text_offset)

    # echo with generation: the prompt, then the continuation; logprobs for both
    r = await client.completions.create(model="gemma", prompt=prompt, max_tokens=3, echo=True, logprobs=1,
                                        temperature=0, extra_body={"ignore_eos": True})
    ch = r.choices[0]
    assert ch.text.startswith(prompt) and len(ch.text) > len(prompt)
    assert len(ch.logprobs.tokens) == r.usage.prompt_tokens + 3
    # greedy: each generated token is its own top alternative
    for tok, tops in zip(ch.logprobs.tokens[-3:], ch.logprobs.top_logprobs[-3:]):
        assert list(tops) == [tok]
    await client.close()


async def test_n_choices_logit_bias_prompt_lists_and_tokenize(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path)
    msgs = [{"role": "user", "content": "Tell me a short story."}]
    r = await client.chat.completions.create(model="gemma", messages=msgs, n=3, max_tokens=6, temperature=1.0,
                                             seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content is not None for c in r.choices)
    assert 3 <= r.usage.completion_tokens <= 18  # summed over the choices

    finishes: dict[int, str] = {}
    texts: dict[int, str] = {}
    async for chunk in await client.chat.completions.create(model="gemma", messages=msgs, n=2, max_tokens=5,
                                                            stream=True, temperature=0):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert sorted(finishes) == [0, 1] and texts[0] and texts[1]

    # logit_bias: -100 bans the token greedy decoding would pick
    prompt = "The capital of France is"
    base = await client.completions.create(model="gemma", prompt=prompt, max_tokens=1, temperature=0, logprobs=2)
    first = base.choices[0].text
    ids = (await harness.client.post("/tokenize", json={"model": "gemma", "content": first})).json()["tokens"]
    assert len(ids) == 1
    banned = await client.completions.create(model="gemma", prompt=prompt, max_tokens=1, temperature=0,
                                             logit_bias={str(ids[0]): -100}, logprobs=1)
    assert banned.choices[0].text != first
    assert list(base.choices[0].logprobs.top_logprobs[0]) == [first, banned.choices[0].text]  # the runner-up

    # prompts as a list of strings and as token arrays; n per prompt
    prompt_ids = (await harness.client.post("/tokenize", json={"content": prompt, "add_special": True})).json()
    r = await client.completions.create(model="gemma", prompt=[prompt, "One, two,"], max_tokens=2, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    # (greedy texts are not compared across slots: a reused cached prefix may round differently)
    assert r.choices[0].text.startswith(first) and r.choices[1].text.startswith(first)
    assert not r.choices[2].text.startswith(first) and r.usage.completion_tokens == 8
    t = await client.completions.create(model="gemma", prompt=prompt_ids["tokens"], max_tokens=2, temperature=0)
    assert t.choices[0].text.startswith(first) and t.usage.prompt_tokens == len(prompt_ids["tokens"])
    t2 = await client.completions.create(model="gemma", prompt=[prompt_ids["tokens"], prompt_ids["tokens"]],
                                         max_tokens=2, temperature=0)
    assert [c.index for c in t2.choices] == [0, 1] and all(c.text.startswith(first) for c in t2.choices)
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model="gemma", prompt=[10 ** 7], max_tokens=2)

    # /tokenize with pieces, /detokenize round trip
    tk = (await harness.client.post("/tokenize", json={"content": "Hello world", "with_pieces": True})).json()
    assert [p["piece"] for p in tk["tokens"]] == ["Hello", " world"]
    dt = await harness.client.post("/detokenize", json={"tokens": [p["id"] for p in tk["tokens"]]})
    assert dt.json() == {"content": "Hello world", "prompt": "Hello world"}  # llama.cpp's name, vLLM's
    bad = await harness.client.post("/detokenize", json={"tokens": [10 ** 7]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]
    await client.close()
