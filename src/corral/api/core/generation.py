"""The request core every text-generation API goes through (OpenAI chat and completions
here; Ollama, Anthropic and Responses translate onto it).

    spec = chat_spec(body)                       # a validated ChatCompletionRequest -> GenerationSpec
    result = await generate(request, spec)       # whole answer: GenerationResult
    stream = await open_stream(request, spec)    # first output arrived (or a CorralError raised)
    async for event in stream.events(): ...      # ReasoningEvent | TextEvent | ToolCallEvent | FinishEvent

Numbers are validated once, against the wire's bounds (``check_bounds``, before any choice
takes a slot), and a 400 names the field as the client's dialect calls it (``field_names``).

A spec holds one ``wire.GenerateRequest`` per choice (``n`` > 1: each choice runs in its
own slot, seeds derived from the request's). Errors are ``CorralError`` (400 naming the field,
404, 503...), in each API's own error shape. A client that goes away aborts every choice.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, Union

from starlette.requests import Request

from corral import wire
from corral.api.core.chat_request import ChatCompletionRequest
from corral.api.core.images import ImageRef, attach_images
from corral.api.core.lora import generate_routed
from corral.api.core.schemas import CompletionRequest
from corral.api.core.submit import observe, submit
from corral.api.core.target import Target, resolve
from corral.api.http import plane_of
from corral.control.plane import ControlPlane
from corral.control.stream import RequestStream
from corral.errors import CorralError, InvalidRequest

__all__ = ["GenerationSpec", "Choice", "GenerationResult", "TextEvent", "ReasoningEvent", "ToolCallEvent",
           "FinishEvent", "Event", "GenerationStream", "chat_spec", "completion_spec", "generate",
           "open_stream", "finish_reason", "target_of", "check_bounds"]


@dataclass
class GenerationSpec:
    """What to run: ``requests[i]`` is choice ``i``."""
    model: str  # id or alias, as the client named it
    endpoint: str  # metrics label: "chat", "completions", or a dialect's name
    id: str  # the response id
    requests: list[wire.GenerateRequest]
    prefix: str | None = None  # for the balancer: text that starts the prompt
    images: list[list[ImageRef]] | None = None  # each message's images, loaded by attach_images at submit
    cache_salt: str | None = None  # the body's cache_salt: ControlPlane.generate's tenant (control/keys/cache_tenant.py)
    target: Target | None = None  # ``model`` resolved (api/core/target.py): by the route that needed it first, else at submit
    # the body's name of each wire field whose value came from a differently named one
    # (``check_bounds``: a 400 names the field the client sent); the rest: the wire's leaf name
    field_names: dict[str, str] = field(default_factory=dict)


@dataclass
class Choice:
    index: int
    text: str
    tool_calls: list[wire.ToolCall]
    finish_reason: str  # stop | length | tool_calls | abort
    logprobs: list[wire.TokenLogprob] | None  # None unless asked
    usage: wire.Usage | None = None
    timings: wire.Timings | None = None
    reasoning: str = ""  # the thinking (reasoning models)
    reasoning_budget: int | None = None  # the budget it ran with (-1: unlimited; None: no thinking)


@dataclass
class GenerationResult:
    id: str
    model: str  # the model id that answered
    created: int
    choices: list[Choice]
    usage: wire.Usage  # summed over the choices
    timings: wire.Timings | None  # the first choice's
    streams: list[RequestStream] = field(default_factory=list, repr=False)  # choice i's, ended


@dataclass(slots=True)
class TextEvent:
    index: int  # the choice
    text: str
    logprobs: list[wire.TokenLogprob] = field(default_factory=list)


@dataclass(slots=True)
class ReasoningEvent:
    index: int  # the choice
    text: str  # thinking (it comes before the answer's TextEvents)


@dataclass(slots=True)
class ToolCallEvent:
    index: int  # the choice
    call_index: int  # the call's position in the choice's tool_calls
    call: wire.ToolCall  # complete: id, name, arguments (JSON text)


@dataclass(slots=True)
class FinishEvent:
    index: int
    finish_reason: str
    usage: wire.Usage | None
    timings: wire.Timings | None
    reasoning_budget: int | None = None


Event = Union[ReasoningEvent, TextEvent, ToolCallEvent, FinishEvent]


def finish_reason(fin: wire.Finished | None, n_calls: int) -> str:
    reason = fin.finish_reason if fin else "stop"
    return "tool_calls" if n_calls and reason == "stop" else reason


def check_bounds(spec: GenerationSpec) -> None:
    """Every request of the spec within the wire's bounds (``wire.invalid_field``: the one set
    of numeric bounds the worker applies too), before any takes a slot; else a 400 naming
    the field as the client's dialect calls it (``spec.field_names``)."""
    for req in spec.requests:
        bad = wire.invalid_field(req)
        if bad is not None:
            path, text = bad
            name = spec.field_names.get(path) or path.rsplit(".", 1)[-1] or None
            raise InvalidRequest(f"{name}: {text}" if name else text, param=name)


def _seed(base: int | None, i: int) -> int | None:
    return None if base is None else (base + i) & 0x7FFFFFFF


def chat_spec(body: ChatCompletionRequest, endpoint: str = "chat") -> GenerationSpec:
    """Validate a chat request and turn it into worker requests (raises 400s)."""
    body.check()
    grammar, schema = body.constraint()
    messages = body.wire_messages()
    params = body.sampling()
    rid = "chatcmpl-" + secrets.token_hex(12)
    tools = body.wire_tools()
    reqs = []
    for i in range(body.n):
        p = params if i == 0 else wire.SamplingParams(**{**_fields(params), "seed": _seed(params.seed, i)})
        reqs.append(wire.GenerateRequest(
            id=rid if body.n == 1 else f"{rid}-{i}", messages=messages, params=p, grammar=grammar,
            json_schema=schema, tools=tools, parse_tool_calls=body.parses_tool_calls(),
            parallel_tool_calls=body.parallel_tool_calls is not False, logprobs=body.wire_logprobs(),
            speculative=body.speculative, lora=body.wire_lora(), t_max_predict_ms=body.t_max_predict_ms,
            **body.wire_reasoning()))
    prefix = "\x00".join(f"{m.role}\x01{m.content}" for m in messages)
    names = {"params.max_tokens": _max_name(body), "thinking_budget": "thinking_budget_tokens",
             "logprobs": "top_logprobs"}
    return GenerationSpec(body.model_name(), endpoint, rid, reqs, prefix, body.image_refs(), body.cache_salt,
                          field_names=names)


def completion_spec(body: CompletionRequest, endpoint: str = "completions") -> GenerationSpec:
    body.check()
    params = body.sampling()
    rid = "cmpl-" + secrets.token_hex(12)
    grammar = body.grammar
    schema = None
    if body.json_schema is not None:
        from corral.api.core.structured import check_schema, schema_text
        check_schema(body.json_schema, "json_schema")
        schema = schema_text(body.json_schema)
    reqs = []
    prompts = body.prompts()
    for pi, prompt in enumerate(prompts):
        for j in range(body.n):
            i = pi * body.n + j
            p = params if i == 0 else wire.SamplingParams(**{**_fields(params), "seed": _seed(params.seed, i)})
            text, toks = (prompt, None) if isinstance(prompt, str) else (None, prompt)
            infill = wire.Infill(prefix=text or "", suffix=body.suffix) if body.suffix is not None else None
            reqs.append(wire.GenerateRequest(
                id=rid if len(prompts) * body.n == 1 else f"{rid}-{i}", prompt=None if infill else text,
                prompt_tokens=toks, params=p, grammar=grammar, json_schema=schema, logprobs=body.logprobs,
                echo=body.echo, infill=infill, speculative=body.speculative, lora=body.wire_lora(),
                t_max_predict_ms=body.t_max_predict_ms))
    first = prompts[0]
    return GenerationSpec(body.model_name(), endpoint, rid, reqs, first if isinstance(first, str) else None,
                          cache_salt=body.cache_salt, field_names={"prompt_tokens": "prompt", "params.max_tokens": _max_name(body)})


def _max_name(body: ChatCompletionRequest | CompletionRequest) -> str:
    return "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"


def _fields(p: wire.SamplingParams) -> dict[str, Any]:
    return {f: getattr(p, f) for f in p.__struct_fields__}


def target_of(request: Request, spec: GenerationSpec) -> Target:
    """The spec's model, resolved once (the first time it is asked for)."""
    if spec.target is None:
        spec.target = resolve(request, spec.model, spec.endpoint)
    return spec.target


async def _submit(request: Request, spec: GenerationSpec, *, wait_all: bool) -> list[RequestStream]:
    check_bounds(spec)
    target = target_of(request, spec)
    if spec.images is not None:  # loaded and checked once, before any choice is submitted
        spec.requests, spec.images = await attach_images(request, target.pool, spec.requests, spec.images), None
    plane = plane_of(request)
    coros: list[Awaitable[RequestStream]] = [generate_routed(plane, target, r, spec.prefix, spec.cache_salt)  # api/core/lora.py
                                              for r in spec.requests]
    return await submit(request, target, spec.endpoint, coros, wait_all=wait_all)


def _sum_usage(items: list[wire.Usage | None]) -> wire.Usage:
    u = [x for x in items if x is not None]
    return wire.Usage(sum(x.prompt_tokens for x in u), sum(x.completion_tokens for x in u),
                      sum(x.cached_tokens for x in u), sum(x.reasoning_tokens for x in u))


async def generate(request: Request, spec: GenerationSpec) -> GenerationResult:
    """Run to the end; the whole answer."""
    streams = await _submit(request, spec, wait_all=True)
    plane = plane_of(request)
    choices = []
    for i, (s, req) in enumerate(zip(streams, spec.requests)):
        observe(plane, s, spec.endpoint, 200)
        out = s.take_all()
        fin = s.finished
        choices.append(Choice(i, out.text, out.tool_calls, finish_reason(fin, len(out.tool_calls)),
                              out.logprobs if req.logprobs is not None else None,
                              fin.usage if fin else None, fin.timings if fin else None, out.reasoning,
                              fin.reasoning_budget if fin else None))
    return GenerationResult(spec.id, streams[0].model, int(time.time()), choices,
                            _sum_usage([c.usage for c in choices]), choices[0].timings, streams)


class GenerationStream:
    """A started streamed generation; ``events()`` yields until every choice finished.
    Leaving the iteration early (client gone) aborts the worker requests."""

    def __init__(self, plane: ControlPlane, spec: GenerationSpec, streams: list[RequestStream]) -> None:
        self.plane = plane
        self.spec = spec
        self.streams = streams
        self.id = spec.id
        self.model = streams[0].model
        self.created = int(time.time())
        self.usage: wire.Usage | None = None  # summed, once every choice finished
        self.timings: wire.Timings | None = None  # the first choice's

    async def events(self) -> AsyncIterator[Event]:
        status = 200
        try:
            if len(self.streams) == 1:
                async for ev in self._choice_events(0, self.streams[0]):
                    yield ev
            else:
                async for ev in self._merged():
                    yield ev
            fins = [s.finished for s in self.streams]
            self.usage = _sum_usage([f.usage if f else None for f in fins])
            self.timings = fins[0].timings if fins[0] else None
        except CorralError as exc:
            status = exc.status
            raise
        finally:
            for s in self.streams:
                if not s.done:
                    s.abort()
                    status = 499
            for s in self.streams:
                observe(self.plane, s, self.spec.endpoint, status)

    async def _choice_events(self, index: int, s: RequestStream) -> AsyncIterator[Event]:
        n_calls = 0
        while (piece := await s.next_piece()) is not None:
            if piece.reasoning:
                yield ReasoningEvent(index, piece.reasoning)
            if piece.text or piece.logprobs:
                yield TextEvent(index, piece.text, piece.logprobs)
            for call in piece.tool_calls:
                yield ToolCallEvent(index, n_calls, call)
                n_calls += 1
        fin = s.finished
        yield FinishEvent(index, finish_reason(fin, n_calls), fin.usage if fin else None,
                          fin.timings if fin else None, fin.reasoning_budget if fin else None)

    async def _merged(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()

        async def pump(i: int, s: RequestStream) -> None:
            try:
                async for ev in self._choice_events(i, s):
                    queue.put_nowait(ev)
                queue.put_nowait(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                queue.put_nowait(exc)

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            left = len(tasks)
            while left:
                item = await queue.get()
                if item is None:
                    left -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for t in tasks:
                t.cancel()


async def open_stream(request: Request, spec: GenerationSpec) -> GenerationStream:
    """Submit and wait for every choice's first output (errors before any output raise
    here, so the HTTP status can still say so)."""
    streams = await _submit(request, spec, wait_all=False)
    return GenerationStream(plane_of(request), spec, streams)
