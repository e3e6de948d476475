"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

Hot path: parse and validate the body once (pydantic), hand a ``wire`` request to the
control plane, then copy merged text from the ``RequestStream`` into SSE chunks encoded
with msgspec. No per-token logging, no per-token validation.

A client that disconnects cancels the response task; the ``finally`` sends an Abort to
the worker (harmless if it already finished), which frees the slot.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral import wire
from corral.api.schemas import (ChatCompletionRequest, CompletionRequest, EmbeddingRequest,
                                parse_body)
from corral.control.plane import ControlPlane
from corral.control.stream import RequestStream
from corral.errors import CorralError, ModelDownloading, ModelNotFound

__all__ = ["router", "json_response"]

router = APIRouter()
_json = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(data), status_code=status, media_type="application/json",
                    headers=headers)


def _sse(data: Any) -> bytes:
    return b"data: " + _json.encode(data) + b"\n\n"


def _plane(request: Request) -> ControlPlane:
    return request.app.state.router


def _usage(fin: wire.Finished | None) -> dict[str, Any] | None:
    if fin is None:
        return None
    u = fin.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def _timings(fin: wire.Finished | None) -> dict[str, Any] | None:
    """llama.cpp's ``timings`` object."""
    if fin is None:
        return None
    t, u = fin.timings, fin.usage
    return {
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
    }


def _raise_if_downloading(request: Request, name: str, exc: CorralError) -> None:
    """A model that is still being pulled is not "not found": 503 with its progress."""
    dm = getattr(request.app.state, "downloads", None)
    if not isinstance(exc, ModelNotFound) or dm is None:
        return
    pull = dm.find_by_model(name)
    if pull is not None:
        p = pull.progress()
        done = f"{p['done']} of {p['total']} bytes" if p.get("total") else f"{p['done']} bytes"
        raise ModelDownloading(f"model {name!r} is still downloading ({done}); try again later",
                               retry_after_s=5) from None


def _label(plane: ControlPlane, name: str) -> str:
    """A metrics label: the model id, never a raw client string (bounded cardinality)."""
    try:
        return plane.resolve(name)
    except CorralError:
        return "unknown"


def _observe(plane: ControlPlane, stream: RequestStream, endpoint: str, status: int) -> None:
    fin = stream.finished
    inst = stream.instance_index
    end = stream.ended or time.perf_counter()
    plane.metrics.observe_request(
        stream.model, inst, endpoint, status,
        prompt_tokens=fin.usage.prompt_tokens if fin else 0,
        completion_tokens=fin.usage.completion_tokens if fin else 0,
        ttft_s=(stream.first_token - stream.created) if stream.first_token else None,
        latency_s=end - stream.created)


class _ClientWatch:
    """Races awaitables against the client going away (for the parts of a request
    Starlette does not cancel on disconnect: queueing, loading, non-streamed results)."""

    __slots__ = ("_request", "_watcher")

    def __init__(self, request: Request) -> None:
        self._request = request
        self._watcher: asyncio.Future[None] | None = None

    async def run(self, aw: Any) -> Any:
        task = asyncio.ensure_future(aw)
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(_disconnected(self._request))
        try:
            done, _ = await asyncio.wait((task, self._watcher), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        raise asyncio.CancelledError("client disconnected")

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


async def _disconnected(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _start(request: Request, watch: _ClientWatch, coro: Any, stream_mode: bool
                 ) -> tuple[RequestStream, str | None]:
    """Submit, then wait for the first token (streaming: so an error before any output
    still gets its HTTP status) or for everything (not streaming). Aborts the worker's
    request if the client leaves meanwhile."""
    stream: RequestStream = await watch.run(coro)
    try:
        if stream_mode:
            await watch.run(stream.wait_started())
            return stream, None
        return stream, await watch.run(stream.wait())
    except BaseException:
        stream.abort()
        raise


async def _submit(request: Request, name: str, endpoint: str, coro: Any, stream_mode: bool
                  ) -> tuple[ControlPlane, RequestStream, str | None]:
    """``_start`` with the bookkeeping every endpoint shares: a failure before the
    request runs is counted in the metrics, and a model still being pulled says so."""
    plane = _plane(request)
    watch = _ClientWatch(request)
    try:
        stream, text = await _start(request, watch, coro, stream_mode)
    except CorralError as exc:
        plane.metrics.observe_request(_label(plane, name), None, endpoint, exc.status)
        _raise_if_downloading(request, name, exc)
        raise
    finally:
        watch.close()
    return plane, stream, text


class _Shape:
    """How one endpoint's streamed chunks look (chat and completions differ only here)."""

    __slots__ = ("endpoint", "object", "text_open", "text_close", "first_choice", "final_choice",
                 "usage_null_in_final")

    def __init__(self, endpoint: str, obj: str, text_open: bytes, text_close: bytes,
                 first_choice: dict[str, Any] | None, final_choice: dict[str, Any],
                 usage_null_in_final: bool) -> None:
        self.endpoint = endpoint
        self.object = obj
        self.text_open = text_open  # the chunk's bytes between '"index":0,' and the text
        self.text_close = text_close
        self.first_choice = first_choice  # a chunk sent before any text (chat: the role)
        self.final_choice = final_choice  # the last chunk's choice, beside finish_reason
        self.usage_null_in_final = usage_null_in_final


_CHAT = _Shape("chat", "chat.completion.chunk", b'"delta":{"content":', b"}",
               {"delta": {"role": "assistant", "content": ""}}, {"delta": {}}, True)
_COMPLETION = _Shape("completions", "text_completion", b'"text":', b"", None, {"text": ""}, False)


def _stream_response(plane: ControlPlane, stream: RequestStream, shape: _Shape, rid: str,
                     created: int, include_usage: bool) -> StreamingResponse:
    return StreamingResponse(_events(plane, stream, shape, rid, created, include_usage),
                             media_type="text/event-stream", headers=_SSE_HEADERS)


async def _events(plane: ControlPlane, stream: RequestStream, shape: _Shape, rid: str,
                  created: int, include_usage: bool) -> AsyncIterator[bytes]:
    head = {"id": rid, "object": shape.object, "created": created, "model": stream.model}
    status = 200
    try:
        if shape.first_choice is not None:
            yield _sse({**head, "choices": [{"index": 0, **shape.first_choice,
                                             "logprobs": None, "finish_reason": None}]})
        # the per-token chunk, pre-encoded around the text (same bytes as encoding the dict)
        pre = _sse(head)[:-3] + b',"choices":[{"index":0,' + shape.text_open
        post = shape.text_close + b',"logprobs":null,"finish_reason":null}]}\n\n'
        enc = _json.encode
        try:
            while (text := await stream.next_text()) is not None:
                yield pre + enc(text) + post
        except CorralError as exc:
            status = exc.status
            yield _sse(exc.to_body())
            return
        fin = stream.finished
        final: dict[str, Any] = {**head, "choices": [{"index": 0, **shape.final_choice, "logprobs": None,
                                                      "finish_reason": fin.finish_reason if fin else "stop"}],
                                 "timings": _timings(fin)}
        if include_usage and shape.usage_null_in_final:
            final["usage"] = None
        yield _sse(final)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(fin)})
        yield _DONE
    finally:
        if not stream.done:
            stream.abort()
            status = 499
        _observe(plane, stream, shape.endpoint, status)


# ------------------------------------------------------------------------ chat


@router.post("/v1/chat/completions")
@router.post("/chat/completions", include_in_schema=False)
async def chat_completions(request: Request) -> Response:
    body = await parse_body(request, ChatCompletionRequest)
    body.check()
    name = body.model_name()
    messages = body.wire_messages()
    rid = "chatcmpl-" + secrets.token_hex(12)
    msg = wire.GenerateRequest(id=rid, messages=messages, params=body.sampling())
    prefix = "\x00".join(f"{m.role}\x01{m.content}" for m in messages)
    plane, stream, text = await _submit(request, name, "chat", _plane(request).generate(name, msg, prefix),
                                        body.stream)
    created = int(time.time())
    if body.stream:
        return _stream_response(plane, stream, _CHAT, rid, created, body.include_usage)
    fin = stream.finished
    _observe(plane, stream, "chat", 200)
    assert text is not None
    return json_response({
        "id": rid, "object": "chat.completion", "created": created, "model": stream.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": fin.finish_reason if fin else "stop"}],
        "usage": _usage(fin), "timings": _timings(fin),
    })


# ------------------------------------------------------------------------ completions


@router.post("/v1/completions")
@router.post("/completions", include_in_schema=False)
async def completions(request: Request) -> Response:
    body = await parse_body(request, CompletionRequest)
    body.check()
    name = body.model_name()
    prompt = body.prompt_text()
    rid = "cmpl-" + secrets.token_hex(12)
    msg = wire.GenerateRequest(id=rid, prompt=prompt, params=body.sampling())
    plane, stream, text = await _submit(request, name, "completions",
                                        _plane(request).generate(name, msg, prompt), body.stream)
    created = int(time.time())
    if body.stream:
        return _stream_response(plane, stream, _COMPLETION, rid, created, body.include_usage)
    fin = stream.finished
    _observe(plane, stream, "completions", 200)
    return json_response({
        "id": rid, "object": "text_completion", "created": created, "model": stream.model,
        "choices": [{"index": 0, "text": text, "logprobs": None,
                     "finish_reason": fin.finish_reason if fin else "stop"}],
        "usage": _usage(fin), "timings": _timings(fin),
    })


# ------------------------------------------------------------------------ embeddings


@router.post("/v1/embeddings")
@router.post("/embeddings", include_in_schema=False)
async def embeddings(request: Request) -> Response:
    body = await parse_body(request, EmbeddingRequest)
    name = body.model_name()
    inputs = body.inputs()
    rid = "emb-" + secrets.token_hex(12)
    plane, stream, _ = await _submit(request, name, "embeddings",
                                     _plane(request).embed(name, wire.EmbedRequest(id=rid, inputs=inputs)), False)
    _observe(plane, stream, "embeddings", 200)
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


def _openai_model(plane: ControlPlane, pool: Any) -> dict[str, Any]:
    return {"id": pool.spec.id, "object": "model", "created": int(plane.started_at),
            "owned_by": "corral", "aliases": list(pool.spec.aliases),
            "status": {"value": pool.status()}}


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    plane = _plane(request)
    return json_response({"object": "list",
                          "data": [_openai_model(plane, p) for p in plane.pools.values()]})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> Response:
    plane = _plane(request)
    return json_response(_openai_model(plane, plane.pool(model_id)))
