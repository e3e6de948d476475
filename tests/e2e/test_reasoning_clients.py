"""Reasoning through every dialect with the official SDKs (typed fields): the embedded Gemma
with a chat template that opens ``<think>`` (a few-shot system prompt makes it close the
tag itself), real workers. ``plain`` is the same model without a template: it cannot think."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import ollama
import openai
import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: "
            "{% if m['reasoning_content'] %}<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
            "{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant: <think>\n{% endif %}")
SHOTS = "".join(f"user: What is {a}+{a}?\nassistant: <think>\n{a} plus {a} is {2 * a}.\n</think>\n\n"
                f"The answer is {2 * a}.\n" for a in (1, 2, 3, 4))
MSGS = [{"role": "system", "content": SHOTS}, {"role": "user", "content": "What is 5+5?"}]
STOP = ["\nuser:"]


def _one_integer_n(content: str | None) -> bool:
    """The answer is the schema's object: one integer ``n`` (the number itself is the model's
    greedy choice, 10 on one CPU's kernels and 10**15 on another's)."""
    obj = json.loads(content or "")
    return list(obj) == ["n"] and type(obj["n"]) is int


async def _start(harness: Harness, model_path: Path) -> None:
    common = {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1}
    cfg = harness.config({"thinker": {**common, "chat_template": TEMPLATE, "reasoning_budget_max": 64},
                          "plain": common}, worker_command=None)
    await harness.start(cfg)


async def test_openai_chat_reasoning(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="x", max_retries=0)
    r = await client.chat.completions.create(model="thinker", messages=MSGS, temperature=0, max_tokens=40,  # type: ignore[arg-type]
                                             stop=STOP)
    msg = r.choices[0].message
    assert msg.reasoning_content == "5 plus 5 is 10."  # type: ignore[attr-defined]
    assert msg.content == "The answer is 10."
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    assert r.timings["reasoning_budget_tokens"] == 64  # type: ignore[attr-defined]  # the cap: unlimited by default

    stream = await client.chat.completions.create(model="thinker", messages=MSGS, temperature=0, max_tokens=40,  # type: ignore[arg-type]
                                                  stop=STOP, stream=True, stream_options={"include_usage": True},
                                                  extra_body={"thinking_budget_tokens": 3})
    thought, answer, usage = "", "", None
    async for chunk in stream:
        if chunk.choices:
            d = chunk.choices[0].delta
            thought += getattr(d, "reasoning_content", None) or ""
            answer += d.content or ""
        usage = chunk.usage or usage
    assert thought and "5 plus 5 is 10.".startswith(thought) and answer.strip()
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 3

    off = await client.chat.completions.create(model="thinker", messages=MSGS, temperature=0, max_tokens=20,  # type: ignore[arg-type]
                                               stop=STOP, reasoning_effort="none")
    assert getattr(off.choices[0].message, "reasoning_content", None) is None and off.choices[0].message.content
    kw = await client.chat.completions.create(model="thinker", messages=MSGS, temperature=0, max_tokens=20,  # type: ignore[arg-type]
                                              stop=STOP, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert kw.usage is not None and kw.usage.completion_tokens_details.reasoning_tokens == 0  # type: ignore[union-attr]

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    js = await client.chat.completions.create(model="thinker", messages=MSGS, temperature=0, max_tokens=40,  # type: ignore[arg-type]
                                              response_format={"type": "json_schema",
                                                               "json_schema": {"name": "n", "schema": schema}})
    assert js.choices[0].message.reasoning_content == "5 plus 5 is 10."  # type: ignore[attr-defined]
    assert _one_integer_n(js.choices[0].message.content)

    # history: a template that renders reasoning_content gets it; the plain prompt drops it
    past = [*MSGS, {"role": "assistant", "content": "The answer is 10.", "reasoning_content": "5 plus 5 is 10."},
            {"role": "user", "content": "And 6+6?"}]
    bare = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in past]
    for model, differs in (("thinker", True), ("plain", False)):
        a = await client.chat.completions.create(model=model, messages=past, max_tokens=1)  # type: ignore[arg-type]
        b = await client.chat.completions.create(model=model, messages=bare, max_tokens=1)  # type: ignore[arg-type]
        assert a.usage is not None and b.usage is not None
        assert (a.usage.prompt_tokens > b.usage.prompt_tokens) is differs
        assert a.usage.prompt_tokens >= b.usage.prompt_tokens

    for model, extra in (("thinker", {"thinking_budget_tokens": -1}), ("thinker", {"thinking_budget_tokens": 65}),
                         ("thinker", {"reasoning_effort": "extreme"}), ("plain", {"reasoning_effort": "low"})):
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=model, messages=MSGS, max_tokens=4, extra_body=extra)  # type: ignore[arg-type]


async def test_ollama_think(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = ollama.AsyncClient(host=harness.base_url)
    opts = {"temperature": 0, "num_predict": 40, "stop": STOP}
    r = await client.chat(model="thinker", messages=MSGS, think=True, options=opts)
    assert r.message.thinking == "5 plus 5 is 10." and r.message.content == "The answer is 10."
    thought, answer = "", ""
    async for part in await client.chat(model="thinker", messages=MSGS, think="low", options=opts, stream=True):
        thought += part.message.thinking or ""
        answer += part.message.content or ""
    assert (thought, answer) == ("5 plus 5 is 10.", "The answer is 10.")
    fmt = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    js = await client.chat(model="thinker", messages=MSGS, think=True, format=fmt, options=opts)
    assert js.message.thinking == "5 plus 5 is 10." and _one_integer_n(js.message.content)
    off = await client.chat(model="thinker", messages=MSGS, think=False, options=opts)
    assert not off.message.thinking and off.message.content
    g = await client.generate(model="thinker", prompt="What is 5+5?", system=SHOTS, think=True, options=opts)
    assert g.thinking == "5 plus 5 is 10." and g.response == "The answer is 10."
    gs = [p async for p in await client.generate(model="thinker", prompt="What is 5+5?", system=SHOTS, think=True,
                                                 options=opts, stream=True)]
    assert "".join(p.thinking or "" for p in gs) == "5 plus 5 is 10."
    assert (await client.show("thinker")).capabilities == ["completion", "thinking"]
    assert (await client.show("plain")).capabilities == ["completion"]
    with pytest.raises(ollama.ResponseError) as err:
        await client.chat(model="plain", messages=MSGS, think=True)
    assert err.value.status_code == 400 and "does not support thinking" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        await client.generate(model="thinker", prompt="5+5=", raw=True, think=True)
    assert err.value.status_code == 400 and "raw prompt" in err.value.error
    bad = await harness.client.post("/api/chat", json={"model": "thinker", "messages": MSGS, "think": "extreme"})
    assert bad.status_code == 400 and "think" in bad.json()["error"]


async def test_anthropic_thinking(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = anthropic.AsyncAnthropic(base_url=harness.base_url, api_key="x", max_retries=0)
    system, msgs = SHOTS, MSGS[1:]
    m = await client.messages.create(model="thinker", max_tokens=40, extra_body={"temperature": 0}, system=system, messages=msgs,  # type: ignore[arg-type]
                                     stop_sequences=STOP, thinking={"type": "enabled", "budget_tokens": 20})
    assert [b.type for b in m.content] == ["thinking", "text"]
    block = m.content[0]
    assert block.type == "thinking" and block.thinking == "5 plus 5 is 10." and block.signature
    assert m.content[1].type == "text" and m.content[1].text == "The answer is 10."
    plain = await client.messages.create(model="thinker", max_tokens=20, extra_body={"temperature": 0}, system=system,
                                         messages=msgs, stop_sequences=STOP)  # type: ignore[arg-type]
    assert [b.type for b in plain.content] == ["text"]  # no thinking unless asked

    async with client.messages.stream(model="thinker", max_tokens=40, extra_body={"temperature": 0}, system=system,
                                      messages=msgs, stop_sequences=STOP,  # type: ignore[arg-type]
                                      thinking={"type": "enabled", "budget_tokens": 3}) as s:
        kinds = [ev.type async for ev in s]
        final = await s.get_final_message()
    assert "thinking" in kinds and "signature" in kinds and "text" in kinds
    assert final.content[0].type == "thinking" and "5 plus 5 is 10.".startswith(final.content[0].thinking)
    assert final.content[0].signature and final.content[1].type == "text"

    # history: the thinking block of an earlier turn goes back in (and is rendered)
    again = await client.messages.create(model="thinker", max_tokens=4, system=system, messages=[
        *msgs, {"role": "assistant", "content": [{"type": "thinking", "thinking": "5 plus 5 is 10.",
                                                   "signature": block.signature}, {"type": "text", "text": "10"}]},
        {"role": "user", "content": "And 6+6?"}])  # type: ignore[arg-type]
    assert again.usage.input_tokens > 0
    for model, thinking, max_tokens in (("thinker", {"type": "enabled", "budget_tokens": -1}, 10),
                                        ("thinker", {"type": "enabled", "budget_tokens": 20}, 10)):
        with pytest.raises(anthropic.BadRequestError) as err:
            await client.messages.create(model=model, max_tokens=max_tokens, messages=msgs, thinking=thinking)  # type: ignore[arg-type]
        assert err.value.body["type"] == "error"  # type: ignore[index]
    # Anthropic's thinking is a preference (Claude Code sends it to any model): a budget above
    # the model's cap runs at the cap, a model that cannot think answers without thinking
    capped = await client.messages.create(model="thinker", max_tokens=100, system=system, messages=msgs,  # type: ignore[arg-type]
                                          extra_body={"temperature": 0}, stop_sequences=STOP,
                                          thinking={"type": "enabled", "budget_tokens": 65})
    assert [b.type for b in capped.content] == ["thinking", "text"]
    for thinking in ({"type": "enabled", "budget_tokens": 5}, {"type": "adaptive"}):
        plain = await client.messages.create(model="plain", max_tokens=10, messages=msgs, thinking=thinking)  # type: ignore[arg-type]
        assert all(b.type != "thinking" for b in plain.content)


async def test_responses_reasoning(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="x", max_retries=0)
    r = await client.responses.create(model="thinker", instructions=SHOTS, input="What is 5+5?", temperature=0,
                                      max_output_tokens=30, reasoning={"effort": "low"})
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning" and "message" in kinds
    item = r.output[0]
    assert item.type == "reasoning" and item.content and item.content[0].text == "5 plus 5 is 10."
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.output_text.startswith("The answer is 10.")
    events = [e async for e in await client.responses.create(
        model="thinker", instructions=SHOTS, input="What is 5+5?", temperature=0, max_output_tokens=30,
        stream=True)]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == "5 plus 5 is 10."
    done = next(e for e in events if e.type in ("response.completed", "response.incomplete"))
    assert done.response.output[0].type == "reasoning"
    # the stored conversation keeps the thinking for the next turn
    nxt = await client.responses.create(model="thinker", previous_response_id=r.id, input="And 6+6?",
                                        max_output_tokens=8, reasoning={"effort": "none"})
    assert all(i.type != "reasoning" for i in nxt.output)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="plain", input="hi", max_output_tokens=2, reasoning={"effort": "high"})
    raw = await harness.client.post("/v1/responses", json={"model": "thinker", "input": "hi",
                                                          "reasoning": {"effort": "extreme"}})
    assert raw.status_code == 400 and raw.json()["error"]["param"].startswith("reasoning")
    assert isinstance(raw, httpx.Response)
