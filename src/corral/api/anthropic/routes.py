"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

A translation onto corral's one request path (``corral.api.core.dialect``). Streaming follows
Anthropic's event sequence: ``message_start``, a ``ping``, then per content block
``content_block_start``, ``content_block_delta`` (``thinking_delta`` per piece of
thinking then one ``signature_delta``, ``text_delta`` per piece of text, one
``input_json_delta`` with a tool_use block's arguments), ``content_block_stop``; then
``message_delta`` (stop_reason, stop_sequence, usage) and ``message_stop``; an error
after the stream began is an ``error`` event. Input tokens are known when the worker
finishes, so ``message_start`` reports 0 and ``message_delta`` the real count (the SDKs
take input_tokens from message_delta when present).

count_tokens renders and tokenizes the request without a generation slot
(corral.api.core.token_count), so it never waits behind generations; with images it runs
the request with max_tokens 0 on the generation path (the worker counts the image tokens).

Errors (``corral.api.http``): ``{"type": "error", "error": {"type", "message"}}``; a
full queue or no capacity is 529 ``overloaded_error`` (with Retry-After).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import wire
from corral.api.anthropic.context_edits import apply_context_edits
from corral.api.anthropic.schemas import (AnthropicCountTokensRequest, AnthropicMessagesRequest,
                                          stop_reason)
from corral.api.core.dialect import (Generation, ReasoningEvent, TextEvent, ToolCallEvent, build_spec,
                                     parse_arguments, run_generation)
from corral.api.core.generation import GenerationSpec
from corral.api.core.token_count import count_chat_tokens
from corral.api.http import InTaskStreamingResponse, error_body
from corral.api.core.schemas import parse_body
from corral.errors import CorralError

__all__ = ["router"]

router = APIRouter()
_json = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _json.encode(data) + b"\n\n"


def _usage(gen: Generation, cache: bool) -> dict[str, Any]:
    """Anthropic's usage: the prompt is input + cache read + cache creation. Read: the
    prefix reused from a slot or the prompt cache; creation (when the request carries
    ``cache_control``): the rest, evaluated and kept for the next request; input: what
    was evaluated without being asked to be kept."""
    o = gen.outcome()
    fresh = max(0, o.prompt_tokens - o.cached_tokens)
    return {"input_tokens": 0 if cache else fresh, "output_tokens": o.completion_tokens,
            "cache_read_input_tokens": o.cached_tokens, "cache_creation_input_tokens": fresh if cache else 0}


def _tool_use(call: wire.ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": parse_arguments(call)}


def _spec(body: AnthropicCountTokensRequest, endpoint: str, params: wire.SamplingParams) -> GenerationSpec:
    salt = body.cache_salt if isinstance(body, AnthropicMessagesRequest) else None
    return build_spec(body.model, endpoint, body.openai_messages(), params, reasoning=body.reasoning(),
                      cache_salt=salt, field_names={"thinking_budget": "thinking.budget_tokens"}, **body.openai_chat())


def signature(thinking: str) -> str:
    """A thinking block's ``signature``: a digest of its text (the SDKs carry it back)."""
    return base64.b64encode(hashlib.sha256(thinking.encode("utf-8")).digest()).decode()


@router.post("/v1/messages")
async def messages(request: Request) -> Response:
    body = await parse_body(request, AnthropicMessagesRequest)
    body.check()
    edits = apply_context_edits(body)
    spec = _spec(body, "anthropic_messages", body.sampling())
    mid = "msg_" + secrets.token_hex(12)
    gen = await run_generation(request, spec, stream=body.stream)
    tail = _Tail(body.stop_sequences, body.asks_cache(),
                 None if edits is None else {"context_management": {"applied_edits": edits}})
    if not body.stream:
        o = gen.outcome()
        reason, seq = stop_reason(o.finish_reason, o.stop_string, body.stop_sequences)
        content: list[dict[str, Any]] = [{"type": "thinking", "thinking": gen.reasoning,
                                          "signature": signature(gen.reasoning)}] if gen.reasoning else []
        content += [{"type": "text", "text": gen.text}] if gen.text else []
        content += [_tool_use(c) for c in gen.tool_calls]
        return Response(_json.encode({
            "id": mid, "type": "message", "role": "assistant", "model": gen.model, "content": content,
            "stop_reason": reason, "stop_sequence": seq, "usage": _usage(gen, tail.cache), **(tail.extra or {})}),
            media_type="application/json")
    return InTaskStreamingResponse(gen.closing(_chunks(gen, mid, tail)), media_type="text/event-stream", headers=_SSE_HEADERS)


@dataclass(frozen=True, slots=True)
class _Tail:
    """What the end of an answer needs from its request."""

    stops: list[str] | None  # the request's stop_sequences
    cache: bool  # it carries cache_control (usage: cache creation)
    extra: dict[str, Any] | None  # more fields of the message (context_management)


async def _chunks(gen: Generation, mid: str, tail: _Tail) -> AsyncIterator[bytes]:
    yield _event("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": gen.model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}})
    yield _event("ping", {"type": "ping"})
    index = -1
    text_open = False
    thoughts: list[str] = []  # the open thinking block's text
    enc = _json.encode
    pre = b""
    try:
        async for ev in gen.events():
            if isinstance(ev, ReasoningEvent):
                if text_open:  # (thinking comes first; should more follow an answer, a new block)
                    text_open = False
                    yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
                if not thoughts:
                    index += 1
                    yield _event("content_block_start", {"type": "content_block_start", "index": index,
                                                         "content_block": {"type": "thinking", "thinking": "",
                                                                           "signature": ""}})
                thoughts.append(ev.text)
                yield _event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                     "delta": {"type": "thinking_delta", "thinking": ev.text}})
                continue
            if thoughts:
                for line in _close_thinking(index, thoughts):
                    yield line
                thoughts = []
            if isinstance(ev, TextEvent) and ev.text:
                if not text_open:
                    index += 1
                    text_open = True
                    yield _event("content_block_start", {"type": "content_block_start", "index": index,
                                                         "content_block": {"type": "text", "text": ""}})
                    pre = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                           + str(index).encode() + b',"delta":{"type":"text_delta","text":')
                yield pre + enc(ev.text) + b"}}\n\n"
            elif isinstance(ev, ToolCallEvent):
                if text_open:
                    text_open = False
                    yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
                index += 1
                yield _event("content_block_start", {"type": "content_block_start", "index": index,
                                                     "content_block": {**_tool_use(ev.call), "input": {}}})
                yield _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": ev.call.arguments or "{}"}})
                yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    except CorralError as exc:
        yield _event("error", error_body("anthropic", exc)[1])
        return
    if thoughts:
        for line in _close_thinking(index, thoughts):
            yield line
    if text_open:
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    o = gen.outcome()
    reason, seq = stop_reason(o.finish_reason, o.stop_string, tail.stops)
    yield _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                                   "usage": _usage(gen, tail.cache), **(tail.extra or {})})
    yield _event("message_stop", {"type": "message_stop"})


def _close_thinking(index: int, thoughts: list[str]) -> list[bytes]:
    return [_event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
        "type": "signature_delta", "signature": signature("".join(thoughts))}}),
        _event("content_block_stop", {"type": "content_block_stop", "index": index})]


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    body = await parse_body(request, AnthropicCountTokensRequest)
    body.check()
    apply_context_edits(body)
    spec = _spec(body, "anthropic_count_tokens", wire.SamplingParams(max_tokens=0))  # checks it all
    messages = body.openai_messages()
    images = any(isinstance(m.get("content"), list) and any(p.get("type") == "image_url" for p in m["content"])
                 for m in messages)
    if not images:  # no slot taken
        tools = body.openai_chat().get("tools")
        _, n = await count_chat_tokens(request, {"model": body.model, "messages": messages,
                                                 **({"tools": tools} if tools else {})}, "anthropic_count_tokens")
        return Response(_json.encode({"input_tokens": n}), media_type="application/json")
    gen = await run_generation(request, spec, stream=False)
    return Response(_json.encode({"input_tokens": gen.outcome().prompt_tokens}),
                    media_type="application/json")
