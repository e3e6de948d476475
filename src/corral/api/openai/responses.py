"""OpenAI's Responses API: create, stream, retrieve, cancel and delete responses, and count
their input tokens.

    POST   /v1/responses                   create (``stream``: typed events, corral.api.openai.responses_stream)
    GET    /v1/responses/{id}              a stored response (``background``: its status while it runs)
    POST   /v1/responses/{id}/cancel       cancel a background response
    DELETE /v1/responses/{id}              forget a stored response
    POST   /v1/responses/input_tokens      {"object": "response.input_tokens", "input_tokens": N}

A translation onto corral's one request path (``corral.api.core.dialect``). A reasoning
model's thinking is a ``reasoning`` output item (its text in ``content`` as ``reasoning_text``)
before the message; a ``reasoning`` input item reaches the template with the assistant turn
after it. Tools: corral.api.openai.responses_tools (hosted tools are left out, with
``warnings`` in the response).

``store`` (default true, as OpenAI's) keeps the response and its conversation in
corral.api.openai.responses_store, for the key that made it only; ``previous_response_id``
continues it (404 for an id this key has no response under). ``background: true``
(needs ``store``, not ``stream``) answers at once with status ``queued``; the generation runs
on without the connection, in the key's fair share of the model's queue, at most
``MAX_BACKGROUND`` per key at a time (429 beyond); GET shows ``in_progress``, then the
result; cancel ends it (``cancelled``). ``input_tokens`` renders and tokenizes the request
without taking a generation slot. Errors are OpenAI-shaped, as on /v1/chat/completions.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.datastructures import State
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.types import Message

from corral import wire
from corral.api.core.dialect import Generation, build_spec, run_generation
from corral.api.core.generation import GenerationSpec
from corral.api.core.schemas import parse_body
from corral.api.core.token_count import count_chat_tokens
from corral.api.http import InTaskStreamingResponse, json_response
from corral.api.openai.responses_schemas import ResponsesRequest
from corral.api.openai.responses_store import ResponseStore, StoredResponse
from corral.api.openai.responses_stream import Shape, events, status_of
from corral.api.openai.responses_tools import Toolbox
from corral.control.keys.ring import ANONYMOUS_NAME, current_caller
from corral.errors import CorralError, InvalidRequest, RateLimited, UnsupportedOption
from corral.state.paths import state_dir

__all__ = ["router", "MAX_BACKGROUND", "open_store"]

router = APIRouter()
_json = msgspec.json.Encoder()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
MAX_BACKGROUND = 8  # running background responses per key


class _Responses:
    """The stored responses and the background generations still running, by id."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        self.running: dict[str, tuple[str, asyncio.Task[None]]] = {}  # id -> (owner, task)

    def close(self) -> None:
        for _, task in self.running.values():
            task.cancel()
        self.store.close()


def open_store(app_state: State, configured_dir: Path | None) -> None:
    """Called by the app's lifespan: the store in ``state_dir``; ``close_store`` at the end."""
    app_state.responses = _Responses(ResponseStore(state_dir(configured_dir)))


def _responses(request: Request) -> _Responses:
    parts = getattr(request.app.state, "responses", None)
    if not isinstance(parts, _Responses):
        raise CorralError("the response store is not open")
    return parts


def _owner() -> str:
    caller = current_caller()
    return caller.name if caller is not None else ANONYMOUS_NAME


def _assistant(text: str, calls: list[wire.ToolCall], thought: str) -> dict[str, Any]:
    """The answer as an OpenAI chat message, for the conversation store."""
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if thought:
        msg["reasoning_content"] = thought
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return msg


async def _prepare(request: Request, body: ResponsesRequest, owner: str) -> tuple[
        Toolbox, list[dict[str, Any]], dict[str, Any]]:
    """The request's tools, its conversation (earlier turns included) and chat fields."""
    tools = Toolbox(body.tools)
    history: list[dict[str, Any]] = []
    if body.previous_response_id:
        prev = await _responses(request).store.get(body.previous_response_id, owner, param="previous_response_id")
        history = prev.conversation
    conversation = history + body.input_messages(tools.warnings)
    return tools, conversation, body.openai_chat(tools)


def _spec(body: ResponsesRequest, conversation: list[dict[str, Any]], chat: dict[str, Any]) -> GenerationSpec:
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    return build_spec(body.model, "responses", system + conversation, body.sampling(),
                      reasoning=body.wire_reasoning(), cache_salt=body.cache_salt,
                      field_names={"params.max_tokens": "max_output_tokens", "logprobs": "top_logprobs",
                                   "thinking_budget": "reasoning"}, **chat)


def _output(shape: Shape, gen: Generation) -> list[dict[str, Any]]:
    output = [shape.thinking(gen.reasoning, "completed")] if gen.reasoning else []
    output += [shape.message(gen.text, "completed")] if gen.text or not gen.tool_calls else []
    return output + [shape.call(c, "completed") for c in gen.tool_calls]


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest)
    owner = _owner()
    parts = _responses(request)
    tools, conversation, chat = await _prepare(request, body, owner)
    spec = _spec(body, conversation, chat)
    if body.background:
        return await _start_background(request, parts, body, owner, tools, conversation, spec)
    gen = await run_generation(request, spec, stream=body.stream)
    shape = Shape(body, gen.model, tools)

    async def remember(text: str, calls: list[wire.ToolCall], thought: str, response: dict[str, Any]) -> None:
        if body.store:
            await parts.store.put(StoredResponse(shape.id, owner, response,
                                                 conversation + [_assistant(text, calls, thought)]))

    if not body.stream:
        response = shape.response(status_of(gen), _output(shape, gen), gen)
        await remember(gen.text, gen.tool_calls, gen.reasoning, response)
        return Response(_json.encode(response), media_type="application/json")
    return InTaskStreamingResponse(events(gen, shape, remember), media_type="text/event-stream",
                             headers=_SSE_HEADERS)


async def _start_background(request: Request, parts: _Responses, body: ResponsesRequest, owner: str,
                            tools: Toolbox, conversation: list[dict[str, Any]], spec: GenerationSpec) -> Response:
    if body.stream:
        raise UnsupportedOption("background responses are not streamed here: create it, then GET it",
                                param="background")
    if not body.store:
        raise InvalidRequest("background responses must be stored (store: true)", param="store")
    if sum(1 for o, _ in parts.running.values() if o == owner) >= MAX_BACKGROUND:
        raise RateLimited(f"this key already runs {MAX_BACKGROUND} background responses; wait for one to end",
                          retry_after_s=5)
    shape = Shape(body, spec.model, tools)
    await parts.store.put(StoredResponse(shape.id, owner, shape.response("queued", [], None), conversation))
    detached = StarletteRequest(request.scope, _never_disconnects)  # the run outlives this connection

    async def run() -> None:
        try:
            await parts.store.put(StoredResponse(shape.id, owner, shape.response("in_progress", [], None),
                                                 conversation))
            gen = await run_generation(detached, spec, stream=False)
            shape.model = gen.model
            response = shape.response(status_of(gen), _output(shape, gen), gen)
            convo = conversation + [_assistant(gen.text, gen.tool_calls, gen.reasoning)]
        except asyncio.CancelledError:
            response, convo = shape.response("cancelled", [], None), conversation
        except CorralError as exc:
            response, convo = shape.response("failed", [], None), conversation
            response["error"] = {"code": exc.code or "server_error", "message": exc.message}
        finally:
            parts.running.pop(shape.id, None)
        with contextlib.suppress(Exception):
            await asyncio.shield(parts.store.put(StoredResponse(shape.id, owner, response, convo)))

    parts.running[shape.id] = (owner, asyncio.ensure_future(run()))
    return json_response(shape.response("queued", [], None))


async def _never_disconnects() -> Message:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    item = await _responses(request).store.get(response_id, _owner())
    return json_response(item.response)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> Response:
    parts = _responses(request)
    owner = _owner()
    item = await parts.store.get(response_id, owner)
    running = parts.running.get(response_id)
    if running is None:
        if item.response.get("background"):
            return json_response(item.response)  # already over: cancelling it again changes nothing
        raise InvalidRequest("only a background response can be cancelled", param="response_id")
    task = running[1]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(task)
    return json_response((await parts.store.get(response_id, owner)).response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    parts = _responses(request)
    owner = _owner()
    running = parts.running.get(response_id)
    await parts.store.delete(response_id, owner)
    if running is not None and running[0] == owner:
        running[1].cancel()
    return json_response({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/input_tokens")
async def input_tokens(request: Request) -> Response:
    body = await parse_body(request, ResponsesRequest)
    _, conversation, chat = await _prepare(request, body, _owner())
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = {k: v for k, v in chat.items() if k in ("tools",) and v is not None}
    _, n = await count_chat_tokens(request, {"model": body.model, "messages": system + conversation, **chat},
                                   "responses_input_tokens")
    return json_response({"object": "response.input_tokens", "input_tokens": n})


