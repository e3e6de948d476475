"""The Responses API's objects and stream events (corral.api.openai.responses has the routes).

A streamed response sends ``response.created``, ``response.in_progress``, then per output item
``response.output_item.added`` ... ``response.output_item.done``: the reasoning item
(``response.reasoning_text.delta`` / ``.done``), the assistant message
(``response.content_part.added``, ``response.output_text.delta`` per piece, ``.done``,
``response.content_part.done``) and each tool call in its tool's item type
(corral.api.openai.responses_tools; a function call with
``response.function_call_arguments.delta`` / ``.done``); then ``response.completed`` (or
``response.incomplete`` when max_output_tokens cut it), each with its ``sequence_number``.
An error after the stream began is an ``error`` event followed by ``response.failed``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from corral import wire
from corral.api.core.dialect import Generation, ReasoningEvent, TextEvent, ToolCallEvent
from corral.api.openai.responses_schemas import ResponsesRequest
from corral.api.openai.responses_tools import Toolbox
from corral.errors import CorralError

__all__ = ["Shape", "Remember", "status_of", "events"]

_json = msgspec.json.Encoder()


class Shape:
    """The ids and fixed fields of one response, for its objects and events."""

    def __init__(self, body: ResponsesRequest, model: str, tools: Toolbox) -> None:
        self.body = body
        self.tools = tools
        self.id = "resp_" + secrets.token_hex(16)
        self.item_id = "msg_" + secrets.token_hex(16)
        self.reasoning_id = "rs_" + secrets.token_hex(16)
        self.created = int(time.time())
        self.model = model
        self.seq = 0

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant",
                "content": content if status == "completed" else []}

    def thinking(self, text: str, status: str) -> dict[str, Any]:
        return {"id": self.reasoning_id, "type": "reasoning", "status": status, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else []}

    def call(self, call: wire.ToolCall, status: str) -> dict[str, Any]:
        return self.tools.item(call, status)

    def response(self, status: str, output: list[dict[str, Any]], gen: Generation | None) -> dict[str, Any]:
        b = self.body
        usage = None
        incomplete = None
        if gen is not None and status in ("completed", "incomplete"):
            o = gen.outcome()
            usage = {"input_tokens": o.prompt_tokens, "input_tokens_details": {"cached_tokens": o.cached_tokens},
                     "output_tokens": o.completion_tokens,
                     "output_tokens_details": {"reasoning_tokens": o.reasoning_tokens},
                     "total_tokens": o.prompt_tokens + o.completion_tokens}
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
        fmt = b.text.format.type if b.text and b.text.format else "text"
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "instructions": b.instructions,
                "max_output_tokens": b.max_output_tokens, "temperature": b.temperature, "top_p": b.top_p,
                "previous_response_id": b.previous_response_id, "store": b.store,
                "tools": b.tools or [], "tool_choice": b.tool_choice or "auto",
                "parallel_tool_calls": b.parallel_tool_calls is not False,
                "text": {"format": {"type": fmt}}, "truncation": "disabled", "metadata": b.metadata or {},
                "reasoning": {"effort": b.reasoning.effort if b.reasoning else None, "summary": None},
                "error": None, "incomplete_details": incomplete, "usage": usage,
                "background": b.background, "warnings": self.tools.warnings}

    def event(self, etype: str, data: dict[str, Any]) -> bytes:
        data = {"type": etype, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + etype.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def status_of(gen: Generation) -> str:
    return "incomplete" if gen.outcome().finish_reason == "length" else "completed"


Remember = Callable[[str, list[wire.ToolCall], str, dict[str, Any]], Awaitable[None]]


def events(gen: Generation, shape: Shape, remember: Remember) -> AsyncIterator[bytes]:
    """The response's event stream (the generation closed at its end)."""
    return gen.closing(_chunks(gen, shape, remember))


async def _chunks(gen: Generation, shape: Shape, remember: Remember) -> AsyncIterator[bytes]:
    ev = shape.event
    yield ev("response.created", {"response": shape.response("in_progress", [], None)})
    yield ev("response.in_progress", {"response": shape.response("in_progress", [], None)})
    pieces: list[str] = []
    calls: list[wire.ToolCall] = []
    done: list[dict[str, Any]] = []  # finished output items
    text_index: int | None = None
    thoughts: list[str] = []
    thinking_index: int | None = None
    enc = _json.encode
    head = b""

    def close_thinking() -> list[bytes]:
        text = "".join(thoughts)
        item = shape.thinking(text, "completed")
        done.append(item)
        return [ev("response.reasoning_text.done", {"item_id": shape.reasoning_id, "output_index": thinking_index,
                                                    "content_index": 0, "text": text}),
                ev("response.output_item.done", {"output_index": thinking_index, "item": item})]

    def close_text() -> list[bytes]:
        text = "".join(pieces)
        where = {"item_id": shape.item_id, "output_index": text_index, "content_index": 0}
        item = shape.message(text, "completed")
        done.append(item)
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return [ev("response.output_text.done", {**where, "text": text, "logprobs": []}),
                ev("response.content_part.done", {**where, "part": part}),
                ev("response.output_item.done", {"output_index": text_index, "item": item})]

    try:
        async for e in gen.events():
            if isinstance(e, ReasoningEvent):
                if thinking_index is None:
                    thinking_index = len(done)
                    yield ev("response.output_item.added", {"output_index": thinking_index,
                                                            "item": shape.thinking("", "in_progress")})
                thoughts.append(e.text)
                yield ev("response.reasoning_text.delta", {"item_id": shape.reasoning_id, "output_index":
                                                           thinking_index, "content_index": 0, "delta": e.text})
                continue
            if thinking_index is not None and len(done) == thinking_index:
                for line in close_thinking():
                    yield line
            if isinstance(e, TextEvent) and e.text:
                if text_index is None:
                    text_index = len(done)
                    where = {"item_id": shape.item_id, "output_index": text_index, "content_index": 0}
                    yield ev("response.output_item.added", {"output_index": text_index,
                                                            "item": shape.message("", "in_progress")})
                    yield ev("response.content_part.added", {**where, "part": {
                        "type": "output_text", "text": "", "annotations": [], "logprobs": []}})
                    head = _json.encode(where)[1:-1]
                pieces.append(e.text)
                yield (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                       b'"sequence_number":' + str(shape.seq).encode() + b"," + head
                       + b',"delta":' + enc(e.text) + b',"logprobs":[]}\n\n')
                shape.seq += 1
            elif isinstance(e, ToolCallEvent):
                if text_index is not None and len(done) == text_index:
                    for line in close_text():
                        yield line
                calls.append(e.call)
                index = len(done)
                item = shape.call(e.call, "in_progress")
                yield ev("response.output_item.added", {"output_index": index, "item": item})
                where = {"item_id": item["id"], "output_index": index}
                if item["type"] == "function_call":
                    yield ev("response.function_call_arguments.delta", {**where, "delta": e.call.arguments})
                    yield ev("response.function_call_arguments.done", {**where, "arguments": e.call.arguments})
                item = shape.call(e.call, "completed")
                if item["type"] == "custom_tool_call":
                    yield ev("response.custom_tool_call_input.delta", {**where, "delta": item["input"]})
                    yield ev("response.custom_tool_call_input.done", {**where, "input": item["input"]})
                done.append(item)
                yield ev("response.output_item.done", {"output_index": index, "item": item})
    except CorralError as exc:
        yield ev("error", {"code": exc.code, "message": exc.message, "param": exc.param})
        failed = shape.response("failed", [], None)
        failed["error"] = {"code": exc.code or "server_error", "message": exc.message}
        yield ev("response.failed", {"response": failed})
        return
    if thinking_index is not None and len(done) == thinking_index:
        for line in close_thinking():
            yield line
    if text_index is not None and len(done) == text_index:
        for line in close_text():
            yield line
    final = status_of(gen)
    response = shape.response(final, done, gen)
    await remember("".join(pieces), calls, "".join(thoughts), response)
    yield ev(f"response.{final}", {"response": response})
