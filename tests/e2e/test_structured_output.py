"""Structured output and tool calls through the official openai client, with real workers
and the embedded Gemma base model (no chat template, no tool training)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                       "age": {"type": "integer"}},
                     "required": ["name", "age"]},
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
            "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 2},
        },
        "required": ["tags", "scores"],
    },
    "enum_optional": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "note": {"type": "string", "maxLength": 10},
                       "size": {"type": "integer"}},
        "required": ["color"],
    },
    "pattern_length": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                       "word": {"type": "string", "minLength": 2, "maxLength": 6}},
        "required": ["code", "word"],
    },
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}},
                   "required": ["zone"]}}}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


async def _start(harness: Harness, model_path: Path, **model: Any) -> openai.AsyncOpenAI:
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 4096, "n_parallel": 4, "threads": 1,
                                    **model}}, worker_command=None)
    await harness.start(cfg)
    return openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)


async def _ask(client: openai.AsyncOpenAI, stream: bool, **kw: Any) -> tuple[str, str]:
    """(text, finish_reason), streamed or not."""
    if not stream:
        r = await client.chat.completions.create(model="gemma", **kw)
        return r.choices[0].message.content or "", r.choices[0].finish_reason
    parts, finish = [], ""
    async for chunk in await client.chat.completions.create(model="gemma", stream=True, **kw):
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    return "".join(parts), finish


async def test_json_schema_answers_validate(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path)
    cases = [(name, stream, temp) for name in SCHEMAS for stream in (False, True) for temp in (0.0, 1.0)]
    slots = asyncio.Semaphore(4)  # the model's slots: no queueing behind the harness's short queue timeout

    async def one(name: str, stream: bool, temp: float) -> tuple[str, str]:
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}
        async with slots:
            return await _ask(client, stream, messages=[{"role": "user", "content": f"Give me a {name} example as JSON."}],
                              response_format=fmt, temperature=temp, seed=7, max_tokens=300)

    answers = await asyncio.gather(*(one(*c) for c in cases))
    for (name, stream, temp), (text, finish) in zip(cases, answers):
        assert finish == "stop", (name, stream, temp, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])
    await client.close()


async def test_json_object_grammar_and_top_level_schema(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path)
    msgs = [{"role": "user", "content": "Describe a cat in JSON."}]
    text, finish = await _ask(client, False, messages=msgs, response_format={"type": "json_object"},
                              temperature=0, max_tokens=200)
    assert text.lstrip().startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    text, finish = await _ask(client, True, messages=msgs, temperature=1.0, seed=1, max_tokens=5,
                              extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert text in ("yes", "no") and finish == "stop"
    schema = SCHEMAS["enum_optional"]
    text, finish = await _ask(client, False, messages=msgs, temperature=0, max_tokens=100,
                              extra_body={"json_schema": schema})
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)
    # completions take grammar / json_schema too
    c = await client.completions.create(model="gemma", prompt="Answer:", max_tokens=5, temperature=0,
                                        extra_body={"grammar": 'root ::= [0-9] [0-9]'})
    assert len(c.choices[0].text) == 2 and c.choices[0].text.isdigit()
    # a keyword the converter cannot honour is a 400 naming it
    with pytest.raises(openai.BadRequestError) as ei:
        await client.chat.completions.create(model="gemma", messages=msgs, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}})
    assert ei.value.param == "response_format.json_schema.schema.properties.n.multipleOf"
    assert "multipleOf" in ei.value.message
    with pytest.raises(openai.BadRequestError) as ei:
        await client.chat.completions.create(model="gemma", messages=msgs, extra_body={"grammar": "root ::= nope"})
    assert "grammar" in ei.value.message
    await client.close()


def _check_call(call: Any, allowed: set[str]) -> tuple[str, dict[str, Any]]:
    assert call.type == "function" and call.id
    assert call.function.name in allowed
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, PARAMS[call.function.name])
    return call.function.name, args


async def test_forced_tool_calls_on_a_base_model(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path)
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for temp in (0.0, 1.0):
        r = await client.chat.completions.create(model="gemma", messages=msgs, tools=[WEATHER, TIME],
                                                 tool_choice=named, temperature=temp, seed=3, max_tokens=150)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        assert len(ch.message.tool_calls) == 1
        _check_call(ch.message.tool_calls[0], {"get_weather"})
        r = await client.chat.completions.create(model="gemma", messages=msgs, tools=[WEATHER, TIME],
                                                 tool_choice="required", temperature=temp, seed=3, max_tokens=150)
        assert r.choices[0].finish_reason == "tool_calls"
        _check_call(r.choices[0].message.tool_calls[0], {"get_weather", "get_time"})

    # streamed: the deltas reassemble to the same call as the unstreamed answer
    r = await client.chat.completions.create(model="gemma", messages=msgs, tools=[WEATHER], tool_choice=named,
                                             temperature=0, max_tokens=150)
    want = _check_call(r.choices[0].message.tool_calls[0], {"get_weather"})
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in await client.chat.completions.create(
            model="gemma", messages=msgs, tools=[WEATHER], tool_choice=named, temperature=0, max_tokens=150,
            stream=True):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": ""})
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0]
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == want

    # the conversation goes on with the call and its result in the history
    history = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": json.dumps(want[1])}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    r = await client.chat.completions.create(model="gemma", messages=history, tools=[WEATHER], max_tokens=8,
                                             temperature=0, tool_choice="none")
    assert r.choices[0].finish_reason in ("stop", "length") and not r.choices[0].message.tool_calls

    with pytest.raises(openai.BadRequestError) as ei:
        await client.chat.completions.create(model="gemma", messages=msgs, tools=[WEATHER],
                                             tool_choice={"type": "function", "function": {"name": "nope"}})
    assert ei.value.param == "tool_choice.function.name"
    await client.close()


# A Hermes/Qwen-style template: tools in the system turn, calls as <tool_call> blocks,
# results as <tool_response>.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{%- elif message.tool_calls %}<|im_start|>assistant\n{%- for call in message.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


async def test_template_with_tools_renders_tools_and_results(harness: Harness, model_path: Path) -> None:
    client = await _start(harness, model_path, chat_template=HERMES_TEMPLATE)
    base = [{"role": "user", "content": "Weather in Oslo?"}]
    plain = await client.chat.completions.create(model="gemma", messages=base, max_tokens=1, temperature=0)
    with_tools = await client.chat.completions.create(model="gemma", messages=base, tools=[WEATHER],
                                                      max_tokens=1, temperature=0)
    tool_tokens = (await harness.client.post("/tokenize", json={"model": "gemma", "content": json.dumps(
        WEATHER)})).json()["tokens"]
    # the tools reached the template: the prompt grew by at least the tool's JSON
    assert with_tools.usage.prompt_tokens - plain.usage.prompt_tokens >= len(tool_tokens) - 5
    history = base + [
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "minus four degrees"}]
    r = await client.chat.completions.create(model="gemma", messages=history, tools=[WEATHER], max_tokens=1,
                                             temperature=0)
    result_tokens = (await harness.client.post("/tokenize", json={
        "content": '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
                   '"unit": "celsius"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nminus four '
                   'degrees\n</tool_response><|im_end|>\n'})).json()["tokens"]
    assert abs(r.usage.prompt_tokens - with_tools.usage.prompt_tokens - len(result_tokens)) <= 3
    # a forced call still comes back parsed
    f = await client.chat.completions.create(model="gemma", messages=base, tools=[WEATHER], tool_choice="required",
                                             max_tokens=150, temperature=0)
    _check_call(f.choices[0].message.tool_calls[0], {"get_weather"})
    await client.close()
