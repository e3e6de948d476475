"""Tools and structured output through the Ollama, Anthropic and Responses APIs (the
official clients, real workers, the real model): forced tool calls come back in each
API's own shape, JSON schemas are obeyed, tool results go back in."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer"}},
           "required": ["city", "days"]}


def _is_weather(data: object) -> bool:
    """``data`` obeys WEATHER: exactly its keys, a city of at most 20 characters, whole days."""
    return (isinstance(data, dict) and set(data) == {"city", "days"} and isinstance(data["city"], str)
            and len(data["city"]) <= 20 and isinstance(data["days"], int) and not isinstance(data["days"], bool))


async def _start(harness: Harness, model_path: Path) -> None:
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 2048, "n_parallel": 2, "threads": 1}},
                         worker_command=None)
    await harness.start(cfg)


async def test_anthropic_forced_tool_use_and_tool_result(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = anthropic.AsyncAnthropic(base_url=harness.base_url, api_key="x", max_retries=0)
    tools = [{"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER}]
    msgs = [{"role": "user", "content": "What is the weather in Paris for 3 days?"}]
    types = []
    async with client.messages.stream(model="gemma", max_tokens=64, tools=tools, messages=msgs,
                                      tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        async for ev in stream:
            types.append(ev.type)
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert use.name == "get_weather" and _is_weather(use.input)
    assert "content_block_start" in types and types[-1] == "message_stop"

    m = await client.messages.create(model="gemma", max_tokens=8, tools=tools, messages=[
        *msgs, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                  "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]}])
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use") and m.content
    none = await client.messages.create(model="gemma", max_tokens=4, tools=tools, messages=msgs,
                                        tool_choice={"type": "none"})
    assert all(b.type == "text" for b in none.content)
    await client.close()


async def test_ollama_format_schema_and_tools(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = ollama.AsyncClient(host=harness.base_url)
    r = await client.chat(model="gemma", format=WEATHER, options={"num_predict": 64, "temperature": 0},
                          messages=[{"role": "user", "content": "Weather in Rome for 2 days, as JSON."}])
    assert _is_weather(json.loads(r.message.content))
    g = await client.generate(model="gemma", format="json", prompt="A JSON object about a cat:",
                              options={"num_predict": 48, "temperature": 0})
    assert g.response.lstrip().startswith("{")  # JSON mode: an object, complete unless cut at num_predict
    assert g.done_reason == "length" or isinstance(json.loads(g.response), dict)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                               "parameters": WEATHER}}]
    r = await client.chat(model="gemma", tools=tools, options={"num_predict": 8}, messages=[
        {"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}}]},
        {"role": "tool", "content": "Sunny", "tool_name": "get_weather"}])
    assert r.done and r.message.role == "assistant"


async def test_responses_function_call_and_json_schema(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "get_weather", "description": "Weather forecast",
              "parameters": WEATHER}]
    r = await client.responses.create(model="gemma", input="Weather in Oslo for 4 days?", tools=tools,
                                      tool_choice="required", max_output_tokens=64)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and _is_weather(json.loads(call.arguments))

    follow = await client.responses.create(model="gemma", previous_response_id=r.id, max_output_tokens=6,
                                           tools=tools, input=[{"type": "function_call_output",
                                                                "call_id": call.call_id, "output": "Rain"}])
    assert follow.status in ("completed", "incomplete")

    types, args = [], []
    async with client.responses.stream(model="gemma", input="Weather in Lima for 1 day?", tools=tools,
                                       tool_choice={"type": "function", "name": "get_weather"},
                                       max_output_tokens=64) as stream:
        async for ev in stream:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                args.append(ev.delta)
        final = await stream.get_final_response()
    assert "response.output_item.added" in types and types[-1] == "response.completed"
    (call,) = [o for o in final.output if o.type == "function_call"]
    assert _is_weather(json.loads(call.arguments)) and json.loads("".join(args)) == json.loads(call.arguments)

    fmt = {"type": "json_schema", "name": "weather", "schema": WEATHER}
    j = await client.responses.create(model="gemma", input="Weather in Nice for 5 days, as JSON.",
                                      text={"format": fmt}, max_output_tokens=64, temperature=0)
    assert _is_weather(json.loads(j.output_text))
    await client.close()
