"""OpenAI's Responses API: POST /v1/responses (create, and stream with typed events).

A translation onto corral's one request path (``corral.api.core.dialect``). A reasoning model's
thinking is a ``reasoning`` output item (its text in ``content`` as ``reasoning_text``;
streamed as ``response.reasoning_text.delta`` / ``.done``) before the message; a
``reasoning`` input item reaches the template with the assistant turn after it. A
streamed response sends ``response.created``, ``response.in_progress``, ``response.output_item.added``
and ``response.content_part.added`` for the assistant message, one
``response.output_text.delta`` per piece of text, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each tool call a
``function_call`` item (``response.output_item.added``,
``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``); then
``response.completed`` (or ``response.incomplete`` when max_output_tokens cut it),
each with its ``sequence_number``. An error after the stream began is an ``error``
event followed by ``response.failed``. Errors are OpenAI-shaped, as on /v1/chat/completions.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral import wire
from corral.api.core.dialect import (Generation, ReasoningEvent, TextEvent, ToolCallEvent, build_spec,
                                     run_generation)
from corral.api.http import app_part
from corral.api.openai.responses_schemas import ResponsesRequest, ResponseStore
from corral.api.core.schemas import parse_body
from corral.errors import CorralError

__all__ = ["router"]

router = APIRouter()
_json = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _store(request: Request) -> ResponseStore:
    store: ResponseStore | None = app_part(request, "responses")
    if store is None:
        store = request.app.state.responses = ResponseStore()
    return store


class _Shape:
    """The ids and fixed fields of one response, for its objects and events."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.body = body
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

    @staticmethod
    def call(call: wire.ToolCall, status: str) -> dict[str, Any]:
        return {"id": "fc_" + call.id, "type": "function_call", "status": status, "call_id": call.id,
                "name": call.name, "arguments": call.arguments if status == "completed" else ""}

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
                "error": None, "incomplete_details": incomplete, "usage": usage}

    def event(self, etype: str, data: dict[str, Any]) -> bytes:
        data = {"type": etype, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + etype.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def _status(gen: Generation) -> str:
    return "incomplete" if gen.outcome().finish_reason == "length" else "completed"


def _assistant(text: str, calls: list[wire.ToolCall], thought: str) -> dict[str, Any]:
    """The answer as an OpenAI chat message, for the conversation store."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if thought:
        msg["reasoning_content"] = thought
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return msg


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest)
    body.check()
    store = _store(request)
    history = store.get(body.previous_response_id) if body.previous_response_id else []
    conversation = history + body.input_messages()
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    spec = build_spec(body.model, "responses", system + conversation, body.sampling(),
                      reasoning=body.wire_reasoning(), **body.openai_chat())
    gen = await run_generation(request, spec, stream=body.stream)
    shape = _Shape(body, gen.model)

    def remember(text: str, calls: list[wire.ToolCall], thought: str) -> None:
        if body.store:
            store.put(shape.id, gen.model, conversation + [_assistant(text, calls, thought)])

    if not body.stream:
        remember(gen.text, gen.tool_calls, gen.reasoning)
        output = [shape.thinking(gen.reasoning, "completed")] if gen.reasoning else []
        output += [shape.message(gen.text, "completed")] if gen.text or not gen.tool_calls else []
        output += [shape.call(c, "completed") for c in gen.tool_calls]
        return Response(_json.encode(shape.response(_status(gen), output, gen)), media_type="application/json")
    return StreamingResponse(_events(gen, shape, remember), media_type="text/event-stream",
                             headers=_SSE_HEADERS)


Remember = Callable[[str, list[wire.ToolCall], str], None]


async def _events(gen: Generation, shape: _Shape, remember: Remember) -> AsyncIterator[bytes]:
    try:
        async for chunk in _chunks(gen, shape, remember):
            yield chunk
    finally:
        gen.close()


async def _chunks(gen: Generation, shape: _Shape, remember: Remember) -> AsyncIterator[bytes]:
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
                item_id = "fc_" + e.call.id
                yield ev("response.output_item.added", {"output_index": index,
                                                        "item": shape.call(e.call, "in_progress")})
                yield ev("response.function_call_arguments.delta", {"item_id": item_id, "output_index": index,
                                                                    "delta": e.call.arguments})
                yield ev("response.function_call_arguments.done", {"item_id": item_id, "output_index": index,
                                                                   "arguments": e.call.arguments})
                item = shape.call(e.call, "completed")
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
    remember("".join(pieces), calls, "".join(thoughts))
    final = _status(gen)
    yield ev(f"response.{final}", {"response": shape.response(final, done, gen)})
