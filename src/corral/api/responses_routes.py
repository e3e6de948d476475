"""OpenAI's Responses API: POST /v1/responses (create, and stream with typed events).

A translation onto corral's one request path (``dialect_core``). A streamed response
sends ``response.created``, ``response.in_progress``, ``response.output_item.added``
(the assistant message), ``response.content_part.added``, one
``response.output_text.delta`` per piece of text, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done`` and
``response.completed`` (or ``response.incomplete`` when max_output_tokens cut it),
each with its ``sequence_number``. An error after the stream began is an ``error``
event followed by ``response.failed``. Errors are OpenAI-shaped, as on /v1/chat/completions.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral import wire
from corral.api.dialect_core import Generation, start_generation
from corral.api.responses_schemas import ResponsesRequest, ResponseStore
from corral.api.schemas import parse_body
from corral.errors import CorralError

__all__ = ["router"]

router = APIRouter()
_json = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _store(request: Request) -> ResponseStore:
    store = getattr(request.app.state, "responses", None)
    if store is None:
        store = request.app.state.responses = ResponseStore()
    return store


class _Shape:
    """The ids and fixed fields of one response, for its objects and events."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.body = body
        self.id = "resp_" + secrets.token_hex(16)
        self.item_id = "msg_" + secrets.token_hex(16)
        self.created = int(time.time())
        self.model = model
        self.seq = 0

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant",
                "content": content if status == "completed" or text else []}

    def response(self, status: str, output: list[dict[str, Any]], gen: Generation | None) -> dict[str, Any]:
        b = self.body
        usage = None
        incomplete = None
        if gen is not None and status in ("completed", "incomplete"):
            o = gen.outcome()
            usage = {"input_tokens": o.prompt_tokens, "input_tokens_details": {"cached_tokens": o.cached_tokens},
                     "output_tokens": o.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": o.prompt_tokens + o.completion_tokens}
            if status == "incomplete":
                incomplete = {"reason": "max_output_tokens"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "instructions": b.instructions,
                "max_output_tokens": b.max_output_tokens, "temperature": b.temperature, "top_p": b.top_p,
                "previous_response_id": b.previous_response_id, "store": b.store,
                "tools": [], "tool_choice": "auto", "parallel_tool_calls": True,
                "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": b.metadata or {},
                "error": None, "incomplete_details": incomplete, "usage": usage}

    def event(self, etype: str, data: dict[str, Any]) -> bytes:
        data = {"type": etype, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + etype.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def _status(gen: Generation) -> str:
    fin = gen.stream.finished
    return "incomplete" if fin is not None and fin.finish_reason == "length" else "completed"


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest)
    body.check()
    store = _store(request)
    history = store.get(body.previous_response_id) if body.previous_response_id else []
    conversation = history + body.input_messages()
    system = [wire.ChatMessage("system", body.instructions)] if body.instructions else []
    msg = wire.GenerateRequest(id="resp-" + secrets.token_hex(12), messages=system + conversation,
                               params=body.sampling())
    gen = await start_generation(request, body.model, "responses", msg, stream=body.stream)
    shape = _Shape(body, gen.model)

    def remember(text: str) -> None:
        if body.store:
            store.put(shape.id, gen.model, conversation + [wire.ChatMessage("assistant", text)])

    if not body.stream:
        text = gen.text or ""
        remember(text)
        return Response(_json.encode(shape.response(_status(gen), [shape.message(text, "completed")], gen)),
                        media_type="application/json")
    return StreamingResponse(_events(gen, shape, remember), media_type="text/event-stream",
                             headers=_SSE_HEADERS)


async def _events(gen: Generation, shape: _Shape, remember: Any) -> AsyncIterator[bytes]:
    status = 200
    ev = shape.event
    where = {"item_id": shape.item_id, "output_index": 0, "content_index": 0}
    try:
        yield ev("response.created", {"response": shape.response("in_progress", [], None)})
        yield ev("response.in_progress", {"response": shape.response("in_progress", [], None)})
        yield ev("response.output_item.added", {"output_index": 0, "item": shape.message("", "in_progress")})
        yield ev("response.content_part.added", {**where, "part": {"type": "output_text", "text": "",
                                                                   "annotations": [], "logprobs": []}})
        pieces: list[str] = []
        enc = _json.encode
        head = _json.encode(where)[1:-1]
        try:
            async for text in gen.texts():
                pieces.append(text)
                yield (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                       b'"sequence_number":' + str(shape.seq).encode() + b"," + head
                       + b',"delta":' + enc(text) + b',"logprobs":[]}\n\n')
                shape.seq += 1
        except CorralError as exc:
            status = exc.status
            yield ev("error", {"code": exc.code, "message": exc.message, "param": exc.param})
            failed = shape.response("failed", [], None)
            failed["error"] = {"code": exc.code or "server_error", "message": exc.message}
            yield ev("response.failed", {"response": failed})
            return
        text = "".join(pieces)
        remember(text)
        yield ev("response.output_text.done", {**where, "text": text, "logprobs": []})
        yield ev("response.content_part.done", {**where, "part": {"type": "output_text", "text": text,
                                                                  "annotations": [], "logprobs": []}})
        item = shape.message(text, "completed")
        yield ev("response.output_item.done", {"output_index": 0, "item": item})
        final = _status(gen)
        yield ev(f"response.{final}", {"response": shape.response(final, [item], gen)})
    finally:
        gen.close(status)
