"""Ollama's generation API: /api/chat, /api/generate, /api/embed, /api/embeddings.

JSON in, NDJSON out (streaming is the default, ``stream: false`` gives one object), as
Ollama does. Each route is a translation onto corral's one request path
(``corral.api.core.dialect``): the same scheduling, queues, prefix reuse, metrics, disconnect-abort
and errors as /v1/chat/completions. Errors are ``{"error": "..."}`` with corral's
status (404 for an unknown model); an error after streaming began is a last
``{"error": ...}`` line, which the ollama client raises as ``ResponseError``.

``keep_alive`` changes a model every key shares (0 unloads it, a negative value pins it
against eviction, a duration sets its idle unload), so it needs the ``manage`` scope: a key
without it is served as if it sent none, and the answer carries
``X-Corral-Keep-Alive-Ignored`` saying so (docs/internals/keys.md).

The final object carries Ollama's statistics in nanoseconds: total_duration (arrival
to end), load_duration (arrival until a worker took it: autoload and queueing),
prompt_eval_count/duration and eval_count/duration (from the worker's timings).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral import wire
from corral.api.core.dialect import (Generation, Outcome, ReasoningEvent, TextEvent, ToolCallEvent, build_spec,
                                     parse_arguments, run_embedding, run_generation)
from corral.api.http import InTaskStreamingResponse, json_response, ndjson_line, plane_of
from corral.api.ollama.context import fit_num_ctx
from corral.api.ollama.schemas import (OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest,
                                       OllamaGenerateRequest, OPTION_NAMES, parse_keep_alive, sampling_from_options)
from corral.api.core.schemas import parse_body
from corral.api.core.target import Target, find, resolve
from corral.control.keys.ring import current_caller
from corral.control.scheduling.pool import ModelPool
from corral.errors import CorralError

__all__ = ["router", "created_at"]

router = APIRouter()
_json = msgspec.json.Encoder()
_NDJSON = "application/x-ndjson"
KEEP_ALIVE_IGNORED = "X-Corral-Keep-Alive-Ignored"


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _slot_context(pool: ModelPool) -> int:
    for inst in pool.instances:
        if inst.info is not None:
            return int(inst.info.n_ctx_slot)
    return pool.spec.slot_ctx()


def _allowed_keep_alive(keep_alive: float | None) -> tuple[float | None, str | None]:
    """The keep_alive the request's key may apply, and why the asked one was ignored (None: it
    was not): changing a shared model's lifetime needs the manage scope."""
    caller = current_caller()
    if keep_alive is None or caller is None or caller.key.allows("manage"):
        return keep_alive, None
    return None, (f"keep_alive {keep_alive:g}s needs the manage scope; the model keeps its configured "
                  "lifetime")


def _noted(response: Response, ignored: str | None) -> Response:
    if ignored is not None:
        response.headers[KEEP_ALIVE_IGNORED] = ignored
    return response


async def _load_or_unload(request: Request, name: str, keep_alive: float | None,
                          body: dict[str, Any]) -> Response:
    """An empty prompt / no messages: load the model (or unload it with keep_alive 0)."""
    plane = plane_of(request)
    target = find(plane, name)  # an adapter model: its base's workers
    model = target.id if target.implied is None else name
    if keep_alive == 0:
        await plane.unload(target.pool, "unloaded by request (keep_alive 0)")
        reason = "unload"
    else:
        await plane.load(target.pool)
        plane.keep_alive(target.pool, keep_alive)
        reason = "load"
    return json_response({"model": model, "created_at": created_at(), **body, "done": True,
                            "done_reason": reason})


def _keep_alive_hook(request: Request, target: Target, keep_alive: float | None) -> Callable[[], None]:
    plane = plane_of(request)
    return lambda: plane.keep_alive(target.pool, keep_alive)


def _calls(calls: list[wire.ToolCall]) -> list[dict[str, Any]]:
    return [{"function": {"name": c.name, "arguments": parse_arguments(c)}} for c in calls]


def _done_reason(o: Outcome) -> str:
    return "stop" if o.finish_reason == "tool_calls" else o.finish_reason


def _stats(o: Outcome) -> dict[str, Any]:
    return {"done_reason": _done_reason(o), "total_duration": _ns(o.total_s),
            "load_duration": _ns(o.load_s), "prompt_eval_count": o.prompt_tokens,
            "prompt_eval_duration": _ns(o.prompt_s), "eval_count": o.completion_tokens,
            "eval_duration": _ns(o.generate_s)}


def _ndjson(gen: Generation, text_line: Callable[[str, str], bytes],
            calls_line: Callable[[list[wire.ToolCall]], bytes],
            final: Callable[[Outcome], dict[str, Any]]) -> StreamingResponse:
    """``text_line(answer, thinking)``: one line of either."""
    async def lines() -> AsyncIterator[bytes]:
        try:
            async for ev in gen.events():
                if isinstance(ev, ReasoningEvent):
                    yield text_line("", ev.text)
                elif isinstance(ev, TextEvent):
                    if ev.text:
                        yield text_line(ev.text, "")
                elif isinstance(ev, ToolCallEvent):
                    yield calls_line([ev.call])
            yield ndjson_line(final(gen.outcome()))
        except CorralError as exc:
            yield ndjson_line({"error": exc.message})
        finally:
            gen.close()
    return InTaskStreamingResponse(lines(), media_type=_NDJSON)


async def _run(request: Request, body: OllamaChatRequest | OllamaGenerateRequest, endpoint: str,
               messages: list[dict[str, Any]], prompt: str | None, ka: float | None) -> Generation:
    target = resolve(request, body.model, endpoint)  # once: the spec, num_ctx and keep_alive use it
    slot_ctx = _slot_context(target.pool)
    params = sampling_from_options(body.options, slot_ctx)
    tools = body.tools if isinstance(body, OllamaChatRequest) else None
    num_ctx = body.options.num_ctx if body.options is not None else None
    if isinstance(body, OllamaChatRequest) and num_ctx is not None:
        messages, cap = await fit_num_ctx(request, target, messages, tools, num_ctx, slot_ctx, body.truncate)
        if cap is not None and (params.max_tokens is None or params.max_tokens > cap):
            params = msgspec.structs.replace(params, max_tokens=cap)
    spec = build_spec(body.model, endpoint, messages, params, prompt=prompt, tools=tools,
                      response_format=body.response_format(), reasoning=body.reasoning(), cache_salt=body.cache_salt,
                      field_names=OPTION_NAMES)
    spec.target = target
    if isinstance(body, OllamaGenerateRequest) and body.suffix is not None:  # fill-in-the-middle
        fim = wire.Infill(prefix=body.prompt, suffix=body.suffix)
        spec.requests = [msgspec.structs.replace(r, prompt=None, infill=fim) for r in spec.requests]
    return await run_generation(request, spec, stream=body.stream,
                                on_close=_keep_alive_hook(request, target, ka))


# ------------------------------------------------------------------------ chat


@router.post("/api/chat")
async def chat(request: Request) -> Response:
    body = await parse_body(request, OllamaChatRequest)
    body.check()
    ka, ignored = _allowed_keep_alive(body.keep_alive_s())
    if not body.messages:
        return _noted(await _load_or_unload(request, body.model, ka,
                                            {"message": {"role": "assistant", "content": ""}}), ignored)
    gen = await _run(request, body, "ollama_chat", body.openai_messages(), None, ka)
    if not body.stream:
        message: dict[str, Any] = {"role": "assistant", "content": gen.text}
        if gen.reasoning:
            message["thinking"] = gen.reasoning
        if gen.tool_calls:
            message["tool_calls"] = _calls(gen.tool_calls)
        return _noted(json_response({"model": gen.model, "created_at": created_at(), "message": message,
                                     "done": True, **_stats(gen.outcome())}), ignored)
    enc = _json.encode
    model = enc(gen.model)

    def text_line(text: str, thinking: str) -> bytes:
        more = b',"thinking":' + enc(thinking) if thinking else b""
        return (b'{"model":' + model + b',"created_at":"' + created_at().encode()
                + b'","message":{"role":"assistant","content":' + enc(text) + more + b'},"done":false}\n')

    def calls_line(calls: list[wire.ToolCall]) -> bytes:
        return enc({"model": gen.model, "created_at": created_at(), "message": {
            "role": "assistant", "content": "", "tool_calls": _calls(calls)}, "done": False}) + b"\n"

    def final(o: Outcome) -> dict[str, Any]:
        return {"model": gen.model, "created_at": created_at(),
                "message": {"role": "assistant", "content": ""}, "done": True, **_stats(o)}

    return _noted(_ndjson(gen, text_line, calls_line, final), ignored)


# ------------------------------------------------------------------------ generate


@router.post("/api/generate")
async def generate(request: Request) -> Response:
    body = await parse_body(request, OllamaGenerateRequest)
    body.check()
    ka, ignored = _allowed_keep_alive(body.keep_alive_s())
    if not body.prompt and not body.system and body.suffix is None and not body.images:
        return _noted(await _load_or_unload(request, body.model, ka, {"response": ""}), ignored)
    prompt, messages = (body.prompt, []) if body.suffix is not None else body.openai_input()
    gen = await _run(request, body, "ollama_generate", messages, prompt, ka)
    if not body.stream:
        thinking = {"thinking": gen.reasoning} if gen.reasoning else {}
        return _noted(json_response({"model": gen.model, "created_at": created_at(),
                                     "response": gen.text, **thinking, "done": True, **_stats(gen.outcome())}),
                      ignored)
    enc = _json.encode
    model = enc(gen.model)

    def text_line(text: str, thinking: str) -> bytes:
        more = b',"thinking":' + enc(thinking) if thinking else b""
        return (b'{"model":' + model + b',"created_at":"' + created_at().encode()
                + b'","response":' + enc(text) + more + b',"done":false}\n')

    def final(o: Outcome) -> dict[str, Any]:
        return {"model": gen.model, "created_at": created_at(), "response": "", "done": True, **_stats(o)}

    return _noted(_ndjson(gen, text_line, lambda calls: b"", final), ignored)


# ------------------------------------------------------------------------ embeddings


@router.post("/api/embed")
async def embed(request: Request) -> Response:
    body = await parse_body(request, OllamaEmbedRequest)
    inputs = body.inputs()
    ka, ignored = _allowed_keep_alive(parse_keep_alive(body.keep_alive))
    target = resolve(request, body.model, "ollama_embed", adapters=False)
    rs, emb = await run_embedding(request, target, "ollama_embed", inputs,
                                  on_close=_keep_alive_hook(request, target, ka), truncate=body.truncate)
    o = Outcome.of(rs)
    return _noted(json_response({"model": rs.model, "embeddings": emb.data, "total_duration": _ns(o.total_s),
                                 "load_duration": _ns(o.load_s), "prompt_eval_count": emb.prompt_tokens}), ignored)


@router.post("/api/embeddings")
async def embeddings(request: Request) -> Response:
    """The legacy single-prompt route: one vector, not normalized (as Ollama's)."""
    body = await parse_body(request, OllamaEmbeddingsRequest)
    ka, ignored = _allowed_keep_alive(parse_keep_alive(body.keep_alive))
    if not body.prompt:
        return _noted(json_response({"embedding": []}), ignored)
    target = resolve(request, body.model, "ollama_embed", adapters=False)
    _, emb = await run_embedding(request, target, "ollama_embed", [body.prompt],
                                 on_close=_keep_alive_hook(request, target, ka), normalize=False)
    return _noted(json_response({"embedding": emb.data[0]}), ignored)
