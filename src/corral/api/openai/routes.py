"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

Chat and completions validate the body once (pydantic), build a ``GenerationSpec`` and
run it through ``corral.api.core.generation`` (the core other APIs share); this module only
shapes results and events as OpenAI does. Streamed text chunks without logprobs are
pre-encoded around the text (msgspec), so the hot path is one encode per piece.
"""

from __future__ import annotations

import base64
import secrets
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import wire
from corral.api.core.adapter_models import AdapterModel, adapter_models, find_adapter_model
from corral.api.core.chat_request import ChatCompletionRequest
from corral.api.core.generation import (FinishEvent, GenerationResult, GenerationStream, ReasoningEvent, TextEvent,
                                        ToolCallEvent, chat_spec, completion_spec, generate, open_stream)
from corral.api.core.submit import observe, submit
from corral.api.core.target import resolve
from corral.api.core.logprob_shapes import chat_logprobs, completion_logprobs
from corral.api.core.conversation_stream import conversation_id, sse_answer
from corral.api.http import json_response, plane_of, sse_data
from corral.api.core.schemas import CompletionRequest, EmbeddingRequest, parse_body
from corral.control.capabilities import can
from corral.control.plane import ControlPlane
from corral.control.scheduling.pool import ModelPool
from corral.errors import CorralError, ModelNotFound

__all__ = ["router", "usage_body", "timings_body"]

router = APIRouter()
_json = msgspec.json.Encoder()
_DONE = b"data: [DONE]\n\n"


def usage_body(u: wire.Usage | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


def timings_body(t: wire.Timings | None, u: wire.Usage | None, budget: int | None = None) -> dict[str, Any] | None:
    """llama.cpp's ``timings`` object (and, for a reasoning model, the thinking budget the
    request ran with: -1 unlimited)."""
    if t is None or u is None:
        return None
    extra = {} if budget is None else {"reasoning_budget_tokens": budget}
    return {**extra,
        "cache_n": u.cached_tokens,
        "prompt_n": u.prompt_tokens - u.cached_tokens,
        "prompt_ms": t.prompt_ms,
        "prompt_per_token_ms": t.prompt_ms / max(1, u.prompt_tokens - u.cached_tokens),
        "prompt_per_second": t.prompt_per_second,
        "predicted_n": u.completion_tokens,
        "predicted_ms": t.predicted_ms,
        "predicted_per_token_ms": t.predicted_ms / max(1, u.completion_tokens),
        "predicted_per_second": t.predicted_per_second,
        "queued_ms": t.queued_ms,
        "grammar_ms": t.grammar_ms,  # corral: time in grammar checks/resamples (constrained requests)
    }


def _call_body(call: wire.ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


async def _sse_events(gs: GenerationStream, chunks: AsyncIterator[bytes], include_usage: bool,
                      obj: str) -> AsyncIterator[bytes]:
    """The chunks, then (include_usage) the usage chunk and [DONE]; an error mid-stream is
    sent as an error event."""
    try:
        async for chunk in chunks:
            yield chunk
    except CorralError as exc:
        yield sse_data(exc.to_body())
        return
    if include_usage:
        yield sse_data({"id": gs.id, "object": obj, "created": gs.created, "model": gs.model,
                    "choices": [], "usage": usage_body(gs.usage)})
    yield _DONE


# ------------------------------------------------------------------------ chat


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    spec = chat_spec(body)
    if body.stream:
        conv_id = conversation_id(request)  # X-Conversation-Id: the stream outlives its client
        gs = await open_stream(request, spec)
        return sse_answer(request, conv_id, _sse_events(gs, _chat_chunks(gs, body.include_usage),
                                                        body.include_usage, "chat.completion.chunk"), gs.streams)
    r = await generate(request, spec)
    return json_response(_chat_body(r))


def _chat_body(r: GenerationResult) -> dict[str, Any]:
    choices = []
    for c in r.choices:
        msg: dict[str, Any] = {"role": "assistant", "content": c.text if (c.text or not c.tool_calls) else None}
        if c.reasoning:
            msg["reasoning_content"] = c.reasoning
        if c.tool_calls:
            msg["tool_calls"] = [_call_body(t) for t in c.tool_calls]
        choices.append({"index": c.index, "message": msg,
                        "logprobs": chat_logprobs(c.logprobs) if c.logprobs is not None else None,
                        "finish_reason": c.finish_reason})
    return {"id": r.id, "object": "chat.completion", "created": r.created, "model": r.model,
            "choices": choices, "usage": usage_body(r.usage),
            "timings": timings_body(r.timings, r.usage, r.choices[0].reasoning_budget)}


async def _chat_chunks(gs: GenerationStream, include_usage: bool) -> AsyncIterator[bytes]:
    head = {"id": gs.id, "object": "chat.completion.chunk", "created": gs.created, "model": gs.model}
    want_lp = gs.spec.requests[0].logprobs is not None
    for i in range(len(gs.streams)):
        yield sse_data({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]})
    pre = [sse_data(head)[:-3] + b',"choices":[{"index":%d,"delta":{"content":' % i for i in range(len(gs.streams))]
    post = b'},"logprobs":null,"finish_reason":null}]}\n\n'
    enc = _json.encode
    last: dict[str, Any] | None = None
    async for ev in gs.events():
        if type(ev) is TextEvent:
            if not want_lp:
                yield pre[ev.index] + enc(ev.text) + post
            else:
                yield sse_data({**head, "choices": [{"index": ev.index, "delta": {"content": ev.text},
                                                 "logprobs": chat_logprobs(ev.logprobs), "finish_reason": None}]})
        elif type(ev) is ReasoningEvent:
            yield sse_data({**head, "choices": [{"index": ev.index, "delta": {"reasoning_content": ev.text},
                                                 "logprobs": None, "finish_reason": None}]})
        elif type(ev) is ToolCallEvent:
            call = {"index": ev.call_index, **_call_body(ev.call)}
            yield sse_data({**head, "choices": [{"index": ev.index, "delta": {"tool_calls": [call]},
                                             "logprobs": None, "finish_reason": None}]})
        elif type(ev) is FinishEvent:
            last = {**head, "choices": [{"index": ev.index, "delta": {}, "logprobs": None,
                                         "finish_reason": ev.finish_reason}],
                    "timings": timings_body(ev.timings, ev.usage, ev.reasoning_budget)}
            if include_usage:
                last["usage"] = None
            yield sse_data(last)


# ------------------------------------------------------------------------ completions


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    spec = completion_spec(body)
    if body.stream:
        conv_id = conversation_id(request)
        gs = await open_stream(request, spec)
        return sse_answer(request, conv_id, _sse_events(gs, _completion_chunks(gs), body.include_usage,
                                                        "text_completion"), gs.streams)
    r = await generate(request, spec)
    echoed = body.echo
    choices = [{"index": c.index, "text": c.text,
                "logprobs": completion_logprobs(c.logprobs, 0, c.text if echoed else None)[0]
                if c.logprobs is not None else None,
                "finish_reason": c.finish_reason} for c in r.choices]
    return json_response({"id": r.id, "object": "text_completion", "created": r.created, "model": r.model,
                          "choices": choices, "usage": usage_body(r.usage),
                          "timings": timings_body(r.timings, r.usage)})


async def _completion_chunks(gs: GenerationStream) -> AsyncIterator[bytes]:
    head = {"id": gs.id, "object": "text_completion", "created": gs.created, "model": gs.model}
    want_lp = gs.spec.requests[0].logprobs is not None
    pre = [sse_data(head)[:-3] + b',"choices":[{"index":%d,"text":' % i for i in range(len(gs.streams))]
    post = b',"logprobs":null,"finish_reason":null}]}\n\n'
    enc = _json.encode
    offsets = [0] * len(gs.streams)
    echo = [r.echo for r in gs.spec.requests]  # the first text of such a choice is its prompt
    async for ev in gs.events():
        if type(ev) is TextEvent:
            if not want_lp:
                yield pre[ev.index] + enc(ev.text) + post
            else:
                first, echo[ev.index] = echo[ev.index], False
                lp, offsets[ev.index] = completion_logprobs(ev.logprobs, offsets[ev.index],
                                                            ev.text if first else None)
                yield sse_data({**head, "choices": [{"index": ev.index, "text": ev.text, "logprobs": lp,
                                                 "finish_reason": None}]})
        elif type(ev) is FinishEvent:
            yield sse_data({**head, "choices": [{"index": ev.index, "text": "", "logprobs": None,
                                             "finish_reason": ev.finish_reason}],
                        "timings": timings_body(ev.timings, ev.usage)})


# ------------------------------------------------------------------------ embeddings


@router.post("/v1/embeddings")
@router.post("/embeddings", include_in_schema=False)
async def embeddings(request: Request) -> Response:
    body = await parse_body(request, EmbeddingRequest)
    name = body.model_name()
    inputs = body.inputs()
    rid = "emb-" + secrets.token_hex(12)
    plane = plane_of(request)
    target = resolve(request, name, "embeddings", adapters=False)
    [stream] = await submit(request, target, "embeddings",
                            [plane.embed(target.pool, wire.EmbedRequest(id=rid, inputs=inputs))], wait_all=True)
    observe(plane, stream, "embeddings", 200)
    emb = stream.embeddings
    assert emb is not None
    data = []
    for i, vec in enumerate(emb.data):
        if body.encoding_format == "base64":
            value: Any = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        else:
            value = vec
        data.append({"object": "embedding", "index": i, "embedding": value})
    return json_response({"object": "list", "data": data, "model": stream.model,
                          "usage": {"prompt_tokens": emb.prompt_tokens, "total_tokens": emb.prompt_tokens}})


# ------------------------------------------------------------------------ models


def _openai_model(plane: ControlPlane, pool: ModelPool) -> dict[str, Any]:
    status = plane.status(pool)  # a variant: the status of the model serving it
    variant = plane.variant_of(pool)
    return {"id": pool.spec.id, "object": "model", "created": int(plane.started_at),
            "owned_by": "corral", "aliases": list(pool.spec.aliases),
            "status": {"value": status, **({"failed": True, "reason": pool.failure_reason} if status == "failed" else {})},
            **({"variant_of": variant} if variant is not None else {}),  # corral's own field
            "vision": can(pool, "vision"), "audio": can(pool, "audio")}


def _openai_adapter_model(plane: ControlPlane, m: AdapterModel) -> dict[str, Any]:
    """An adapter model id (api/core/adapter_models.py): ``parent`` is its base (as vLLM
    lists LoRA modules); images are refused under an adapter, so no vision."""
    return {"id": m.id, "object": "model", "created": int(plane.started_at), "owned_by": "corral",
            "aliases": [], "parent": m.base.spec.id, "adapter": m.describe(),
            "status": {"value": m.base.status()}, "vision": False, "audio": False}


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    plane = plane_of(request)
    return json_response({"object": "list",
                          "data": [_openai_model(plane, p) for p in plane.visible_pools()]
                          + [_openai_adapter_model(plane, m) for m in adapter_models(plane)]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> Response:
    plane = plane_of(request)
    try:
        return json_response(_openai_model(plane, plane.pool(model_id)))
    except ModelNotFound:
        if (m := find_adapter_model(plane, model_id)) is None:
            raise
        return json_response(_openai_adapter_model(plane, m))
