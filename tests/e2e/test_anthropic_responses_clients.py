"""The official ``anthropic`` and ``openai`` (Responses API) clients against corral:
real workers, the real model."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

KEY = "sk-test-key"


async def _start(harness: Harness, model_path: Path) -> None:
    cfg = harness.config({"hf-org/gemma-GGUF:Q4_K_M": {"path": str(model_path), "aliases": ["gemma"],
                                                       "ctx_len": 1024, "n_parallel": 2, "threads": 1}},
                         worker_command=None, api_key=KEY)
    await harness.start(cfg)


async def test_anthropic_client(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    # Anthropic's clients send the key as x-api-key; this SDK version sends a Bearer token
    client = anthropic.AsyncAnthropic(base_url=harness.base_url, api_key="unused", max_retries=0,
                                      default_headers={"x-api-key": KEY, "Authorization": ""})
    bearer = anthropic.AsyncAnthropic(base_url=harness.base_url, api_key=KEY, max_retries=0)

    m = await client.messages.create(model="hf-org/gemma-GGUF:Q4_K_M", max_tokens=8, extra_body={"temperature": 0},
                                     system="You answer in one word.",
                                     messages=[{"role": "user", "content": "Name a color."}])
    assert m.type == "message" and m.role == "assistant" and m.model == "hf-org/gemma-GGUF:Q4_K_M"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8
    assert m.usage.input_tokens > 0

    # a stop sequence the model is sure to write: the count continues with ", three"
    stopped = await bearer.messages.create(
        model="gemma", max_tokens=16, extra_body={"temperature": 0}, stop_sequences=[","],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Count: one, two, three, four,"}]}])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == ","
    assert "," not in "".join(b.text for b in stopped.content if b.type == "text")
    capped = await bearer.messages.create(model="gemma", max_tokens=3, extra_body={"temperature": 0},
                                          messages=[{"role": "user", "content": "Tell me a long story."}])
    assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 3

    events = []
    async with client.messages.stream(model="gemma", max_tokens=12, extra_body={"temperature": 0},
                                      messages=[{"role": "user", "content": "Count: one, two,"}]) as stream:
        async for ev in stream:
            events.append(ev.type)
        final = await stream.get_final_message()
    raw = [e for e in events if e in ("message_start", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop")]
    assert raw[0] == "message_start" and raw[1] == "content_block_start"
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "content_block_delta" in raw
    assert final.content[0].text and final.usage.input_tokens > 0 and final.usage.output_tokens > 0

    count = await client.messages.count_tokens(model="gemma", system="Be brief.",
                                               messages=[{"role": "user", "content": "Name a color."}])
    short = await client.messages.count_tokens(model="gemma", messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens > short.input_tokens > 0
    u = (await client.messages.create(model="gemma", max_tokens=1, system="Be brief.",
                                      messages=[{"role": "user", "content": "Name a color."}])).usage
    # Anthropic's usage: the prompt is input + cache read + cache creation
    assert count.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens

    with pytest.raises(anthropic.NotFoundError) as nf:
        await client.messages.create(model="nope", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as br:
        await client.messages.create(model="gemma", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    assert br.value.body["type"] == "error" and "max_tokens" in br.value.message  # type: ignore[index]
    wrong = anthropic.AsyncAnthropic(base_url=harness.base_url, api_key="unused", max_retries=0,
                                     default_headers={"x-api-key": "wrong", "Authorization": ""})
    with pytest.raises(anthropic.AuthenticationError) as ae:
        await wrong.messages.create(model="gemma", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert ae.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # x-api-key works on every route, Bearer keeps working
    r = await harness.client.get("/v1/models", headers={"x-api-key": KEY})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "hf-org/gemma-GGUF:Q4_K_M"
    assert (await harness.client.get("/api/tags", headers={"Authorization": f"Bearer {KEY}"})).status_code == 200
    assert (await harness.client.get("/api/tags")).json() == {"error": "missing or wrong API key: send "
                                                             "'Authorization: Bearer KEY' or 'x-api-key: KEY'"}
    for c in (client, bearer, wrong):
        await c.close()


async def test_openai_responses_client(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key=KEY, max_retries=0)

    r = await client.responses.create(model="gemma", input="Name a color.", instructions="Answer briefly.",
                                      max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text and r.model == "hf-org/gemma-GGUF:Q4_K_M"
    assert 0 < r.usage.output_tokens <= 8 and r.usage.input_tokens > 0

    follow = await client.responses.create(model="gemma", previous_response_id=r.id, max_output_tokens=4,
                                           input=[{"role": "user", "content": "And another?"}])
    assert follow.usage.input_tokens > r.usage.input_tokens  # the earlier turn came along
    with pytest.raises(openai.NotFoundError) as bi:
        await client.responses.create(model="gemma", input="x", previous_response_id="resp_unknown")
    assert bi.value.param == "previous_response_id" and "no stored response" in bi.value.message
    assert (await client.responses.retrieve(r.id)).output_text == r.output_text
    counted = await client.responses.input_tokens.count(model="gemma", input="Name a color.",
                                                        instructions="Answer briefly.")
    assert counted.input_tokens == r.usage.input_tokens

    types, deltas = [], []
    async with client.responses.stream(model="gemma", input="Count: one, two,", max_output_tokens=10,
                                       temperature=0) as stream:
        async for ev in stream:
            types.append(ev.type)
            if ev.type == "response.output_text.delta":
                deltas.append(ev.delta)
        final = await stream.get_final_response()
    assert types[0] == "response.created" and types[-1] in ("response.completed", "response.incomplete")
    assert "response.output_item.added" in types and "response.output_text.done" in types
    assert final.output_text == "".join(deltas) and final.output_text

    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="nope", input="x")
    await client.close()
