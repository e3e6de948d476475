"""What the Ollama, Anthropic and Responses translations share: running one request on
corral's ONE request path, the request core in ``api/core/generation.py``.

A dialect route parses its own body and translates it into an OpenAI chat request
(messages with tool calls and results, tools, tool_choice, response_format) which
``chat_spec`` validates and turns into worker requests exactly as for
/v1/chat/completions; the dialect's own sampling mapping then replaces the spec's
``SamplingParams``. ``run_generation`` runs the spec with the core's ``generate`` /
``open_stream``: the same ``ControlPlane.generate`` (resolve, autoload, slot or bounded
queue, prefix affinity), disconnect handling, metrics (``endpoint`` label = the
dialect's) and errors. Only the bytes on the wire differ, and the dialect writes those.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from pydantic import ValidationError
from starlette.requests import Request

from corral import wire
from corral.api.core.chat_request import ChatCompletionRequest
from corral.api.core.generation import (Event, FinishEvent, GenerationSpec, GenerationStream, ReasoningEvent,
                                        TextEvent, ToolCallEvent, chat_spec, finish_reason, generate,
                                        open_stream)
from corral.api.core.submit import observe, submit
from corral.api.core.target import Target
from corral.api.http import invalid_request, plane_of
from corral.control.stream import RequestStream

__all__ = ["Outcome", "Generation", "build_spec", "run_generation", "run_embedding",
           "Event", "TextEvent", "ReasoningEvent", "ToolCallEvent", "FinishEvent", "parse_arguments"]


def parse_arguments(call: wire.ToolCall) -> dict[str, Any]:
    """A tool call's JSON arguments as an object (Ollama and Anthropic send objects)."""
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {"value": args}


def build_spec(model: str, endpoint: str, messages: list[dict[str, Any]], params: wire.SamplingParams, *,
               prompt: str | None = None, reasoning: dict[str, Any] | None = None,
               field_names: dict[str, str] | None = None, **chat: Any) -> GenerationSpec:
    """A spec on the one request path: ``messages`` (OpenAI chat shape) and ``chat`` (tools,
    tool_choice, response_format, parallel_tool_calls, cache_salt) are validated by the OpenAI chat
    request; ``params`` (the dialect's sampling) replace its sampling. ``prompt``: a raw
    prompt sent as it is instead of the rendered messages (Ollama's raw generate).
    ``reasoning``: the dialect's thinking as wire fields (think, thinking_budget,
    reasoning_effort). ``field_names``: the dialect's name of each wire field it fills from a
    differently named one (a 400 of the wire's bounds names that)."""
    raw = {"model": model, "messages": messages or [{"role": "user", "content": prompt or ""}],
           **{k: v for k, v in chat.items() if v is not None}}
    try:
        body = ChatCompletionRequest.model_validate(raw)
    except ValidationError as exc:
        raise invalid_request(exc.errors(include_url=False)) from None
    spec = chat_spec(body, endpoint)
    reqs = []
    for r in spec.requests:
        if prompt is not None:
            r = msgspec.structs.replace(r, messages=None, prompt=prompt, params=params)
        else:
            r = msgspec.structs.replace(r, params=params)
        reqs.append(msgspec.structs.replace(r, **reasoning) if reasoning else r)
    spec.requests = reqs
    spec.field_names = {**spec.field_names, "params.max_tokens": "max_tokens", **(field_names or {})}
    if prompt is not None:
        spec.prefix = prompt
    return spec


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a finished generation ended, in the numbers every dialect reports."""

    finish_reason: str  # stop | length | tool_calls | abort
    stop_string: str | None  # the stop string that ended it
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int  # of completion_tokens, inside the thinking
    reasoning_budget: int | None  # the thinking budget it ran with (-1: unlimited; None: no thinking)
    prompt_s: float  # prompt evaluation in the worker
    generate_s: float  # token generation in the worker
    load_s: float  # from arrival until a worker had it: autoload and queueing
    total_s: float  # from arrival until the end

    @classmethod
    def of(cls, stream: RequestStream, n_calls: int = 0) -> "Outcome":
        fin = stream.finished
        end = stream.ended or time.perf_counter()
        load = (stream.started or end) - stream.created
        if fin is None:
            return cls("stop", None, 0, 0, 0, 0, None, 0.0, 0.0, load, end - stream.created)
        u, t = fin.usage, fin.timings
        return cls(finish_reason(fin, n_calls), fin.stop_string, u.prompt_tokens, u.completion_tokens,
                   u.cached_tokens, u.reasoning_tokens, fin.reasoning_budget, t.prompt_ms / 1000,
                   t.predicted_ms / 1000, load, end - stream.created)


class Generation:
    """A generation on a worker slot. Not streamed: ``text``/``tool_calls`` hold the
    answer (``reasoning``: the thinking). Streamed: iterate ``events()`` once. ``outcome()`` once it
    finished."""

    def __init__(self, stream: RequestStream, text: str, tool_calls: list[wire.ToolCall],
                 gs: GenerationStream | None, on_close: Callable[[], Any] | None, reasoning: str = "") -> None:
        self.stream = stream
        self.text = text
        self.reasoning = reasoning
        self.tool_calls = tool_calls
        self._gs = gs
        self._on_close = on_close
        self._n_calls = len(tool_calls)
        self._iterated = False

    @property
    def model(self) -> str:
        return self.stream.model

    async def events(self) -> AsyncIterator[Event]:
        """TextEvent / ToolCallEvent / FinishEvent; raises the request's CorralError.
        Leaving early (client gone) aborts the worker's request."""
        assert self._gs is not None
        self._iterated = True
        try:
            async for ev in self._gs.events():
                if isinstance(ev, ToolCallEvent):
                    self._n_calls += 1
                yield ev
        finally:
            self._closed()

    def outcome(self) -> Outcome:
        return Outcome.of(self.stream, self._n_calls)

    def close(self) -> None:
        """For a dialect's stream generator's ``finally``: a stream the response never got
        to read (the client left during the first bytes) is aborted and counted as 499."""
        gs = self._gs
        if gs is not None and not self._iterated:
            self._iterated = True
            for s in gs.streams:
                if not s.done:
                    s.abort()
                observe(gs.plane, s, gs.spec.endpoint, 499)
        self._closed()

    async def closing(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A dialect's streamed body of this generation (``chunks``), then ``close`` however it
        ends: finished, failed, or the client gone."""
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            try:
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self.close()

    def _closed(self) -> None:
        if self._on_close is not None:
            cb, self._on_close = self._on_close, None
            cb()


async def run_generation(request: Request, spec: GenerationSpec, *, stream: bool,
                         on_close: Callable[[], Any] | None = None) -> Generation:
    """Submit on the one request path. Streaming: returns once the first output is there
    (an error before any output still gets its HTTP status); not streaming: at the end.
    Errors are ``CorralError``, rendered by the app in the dialect's shape."""
    try:
        if stream:
            gs = await open_stream(request, spec)
            return Generation(gs.streams[0], "", [], gs, on_close)
        result = await generate(request, spec)
    except BaseException:
        if on_close is not None:
            on_close()
        raise
    (choice,) = result.choices
    gen = Generation(result.streams[0], choice.text, list(choice.tool_calls), None, on_close, choice.reasoning)
    gen._closed()
    return gen


async def run_embedding(request: Request, target: Target, endpoint: str, inputs: list[str],
                        on_close: Callable[[], Any] | None = None, normalize: bool = True,
                        truncate: bool = False) -> tuple[RequestStream, wire.Embeddings]:
    """Embeddings on the one request path; returns the stream (timings) and the vectors.
    ``truncate``: inputs longer than the model embeds are cut to fit (Ollama's default)."""
    msg = wire.EmbedRequest(id="emb-" + secrets.token_hex(12), inputs=inputs, normalize=normalize,
                            truncate=truncate)
    plane = plane_of(request)
    try:
        coros: list[Awaitable[RequestStream]] = [plane.embed(target.pool, msg)]
        (rs,) = await submit(request, target, endpoint, coros, wait_all=True)
    finally:
        if on_close is not None:
            on_close()
    observe(plane, rs, endpoint, 200)
    assert rs.embeddings is not None
    return rs, rs.embeddings
