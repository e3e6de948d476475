"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

A translation onto corral's one request path (``dialect_core``). Streaming follows
Anthropic's event sequence: ``message_start``, ``content_block_start``, a ``ping``,
``content_block_delta`` (``text_delta``) per piece of text, ``content_block_stop``,
``message_delta`` (stop_reason, stop_sequence, usage) and ``message_stop``; an error
after the stream began is an ``error`` event. Input tokens are known when the worker
finishes, so ``message_start`` reports 0 and ``message_delta`` the real count (the SDKs
take input_tokens from message_delta when present).

count_tokens runs the request with max_tokens 0 on the same path: the worker renders
and tokenizes it exactly as it would for generation and answers without decoding.

Errors (``dialect_errors``): ``{"type": "error", "error": {"type", "message"}}``; a
full queue or no capacity is 529 ``overloaded_error`` (with Retry-After).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral import wire
from corral.api.anthropic_schemas import (AnthropicCountTokensRequest, AnthropicMessagesRequest,
                                          stop_reason)
from corral.api.dialect_core import Generation, start_generation
from corral.api.dialect_errors import error_body
from corral.api.schemas import parse_body
from corral.errors import CorralError

__all__ = ["router"]

router = APIRouter()
_json = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def _usage(gen: Generation) -> dict[str, Any]:
    o = gen.outcome()
    return {"input_tokens": o.prompt_tokens, "output_tokens": o.completion_tokens,
            "cache_read_input_tokens": o.cached_tokens, "cache_creation_input_tokens": 0}


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    body = await parse_body(request, AnthropicMessagesRequest)
    body.check()
    mid = "msg_" + secrets.token_hex(12)
    msg = wire.GenerateRequest(id=mid, messages=body.wire_messages(), params=body.sampling())
    gen = await start_generation(request, body.model, "anthropic_messages", msg, stream=body.stream)
    if not body.stream:
        reason, seq = stop_reason(gen.stream.finished, body.stop_sequences)
        text = gen.text or ""
        return Response(_json.encode({
            "id": mid, "type": "message", "role": "assistant", "model": gen.model,
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": reason, "stop_sequence": seq, "usage": _usage(gen)}),
            media_type="application/json")
    return StreamingResponse(_stream(gen, mid, body.stop_sequences), media_type="text/event-stream",
                             headers=_SSE_HEADERS)


async def _stream(gen: Generation, mid: str, stops: list[str] | None) -> AsyncIterator[bytes]:
    status = 200
    try:
        yield _event("message_start", {"type": "message_start", "message": {
            "id": mid, "type": "message", "role": "assistant", "model": gen.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})
        yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": "text", "text": ""}})
        yield _event("ping", {"type": "ping"})
        pre = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
               b'"delta":{"type":"text_delta","text":')
        enc = _json.encode
        try:
            async for text in gen.texts():
                yield pre + enc(text) + b"}}\n\n"
        except CorralError as exc:
            status = exc.status
            yield _event("error", error_body("anthropic", exc)[1])
            return
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        reason, seq = stop_reason(gen.stream.finished, stops)
        yield _event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": reason, "stop_sequence": seq},
                                       "usage": _usage(gen)})
        yield _event("message_stop", {"type": "message_stop"})
    finally:
        gen.close(status)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    body = await parse_body(request, AnthropicCountTokensRequest)
    body.check()
    msg = wire.GenerateRequest(id="count-" + secrets.token_hex(12), messages=body.wire_messages(),
                               params=wire.SamplingParams(max_tokens=0))
    gen = await start_generation(request, body.model, "anthropic_count_tokens", msg, stream=False)
    return Response(_json.encode({"input_tokens": gen.outcome().prompt_tokens}),
                    media_type="application/json")
