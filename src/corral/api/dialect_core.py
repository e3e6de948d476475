"""What the Ollama, Anthropic and Responses translations share: running one request on
corral's ONE request path.

A dialect route parses its own body, builds the same ``wire.GenerateRequest`` /
``wire.EmbedRequest`` the OpenAI routes build, and hands it to ``start_generation`` /
``run_embedding``: the same ``ControlPlane.generate`` (resolve, autoload, slot or
bounded queue, prefix affinity), the same disconnect handling (a client that leaves
while queued, loading or streaming aborts the worker's request), the same metrics
(``corral_requests_total`` with the dialect's endpoint label) and the same errors. Only
the bytes on the wire differ, and those are written by the dialect module.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from corral import wire
from corral.api.openai_routes import _observe, _submit
from corral.control.plane import ControlPlane
from corral.control.stream import RequestStream
from corral.errors import CorralError

__all__ = ["Generation", "Outcome", "start_generation", "run_embedding", "plane_of"]


def plane_of(request: Request) -> ControlPlane:
    plane: ControlPlane = request.app.state.router
    return plane


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a finished generation ended, in the numbers every dialect reports."""

    finish_reason: str  # stop | length | abort
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prompt_s: float  # prompt evaluation in the worker
    generate_s: float  # token generation in the worker
    load_s: float  # from arrival until a worker had it: autoload and queueing
    total_s: float  # from arrival until the end

    @classmethod
    def of(cls, stream: RequestStream) -> "Outcome":
        fin = stream.finished
        end = stream.ended or time.perf_counter()
        started = stream.started or end
        if fin is None:
            return cls("stop", 0, 0, 0, 0.0, 0.0, started - stream.created, end - stream.created)
        u, t = fin.usage, fin.timings
        return cls(fin.finish_reason, u.prompt_tokens, u.completion_tokens, u.cached_tokens,
                   t.prompt_ms / 1000, t.predicted_ms / 1000, started - stream.created,
                   end - stream.created)


class Generation:
    """A generation running on a worker slot. Read ``texts()`` (streaming) or ``text``
    (not streaming), then ``close()`` exactly once (metrics; aborts the worker's request
    if it is still running, e.g. the client went away)."""

    __slots__ = ("plane", "stream", "endpoint", "text", "_closed", "_on_close")

    def __init__(self, plane: ControlPlane, stream: RequestStream, endpoint: str, text: str | None,
                 on_close: Callable[[], Any] | None) -> None:
        self.plane = plane
        self.stream = stream
        self.endpoint = endpoint
        self.text = text
        self._closed = False
        self._on_close = on_close

    @property
    def model(self) -> str:
        return self.stream.model

    async def texts(self) -> AsyncIterator[str]:
        """Merged text pieces as the worker produces them; raises the request's error."""
        next_text = self.stream.next_text
        while (text := await next_text()) is not None:
            yield text

    def outcome(self) -> Outcome:
        return Outcome.of(self.stream)

    def close(self, status: int = 200) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.stream.done:
            self.stream.abort()
            status = 499
        _observe(self.plane, self.stream, self.endpoint, status)
        if self._on_close is not None:
            self._on_close()


async def start_generation(request: Request, name: str, endpoint: str, msg: wire.GenerateRequest,
                           *, stream: bool, on_close: Callable[[], Any] | None = None) -> Generation:
    """Submit on the one request path. Streaming: returns once the first text is there
    (so an error before any output still gets its HTTP status); not streaming: once all
    text is there. Errors are ``CorralError`` (rendered by the app in the dialect's shape)."""
    prefix = msg.prompt if msg.prompt is not None else "\x00".join(
        f"{m.role}\x01{m.content}" for m in (msg.messages or []))
    try:
        plane, rs, text = await _submit(request, name, endpoint, plane_of(request).generate(name, msg, prefix),
                                        stream)
    except CorralError:
        if on_close is not None:
            on_close()
        raise
    gen = Generation(plane, rs, endpoint, text, on_close)
    if not stream:
        gen.close()
    return gen


async def run_embedding(request: Request, name: str, endpoint: str, inputs: list[str],
                        on_close: Callable[[], Any] | None = None, normalize: bool = True
                        ) -> tuple[RequestStream, wire.Embeddings]:
    """Embeddings on the one request path; returns the stream (timings) and the vectors."""
    msg = wire.EmbedRequest(id="emb-" + secrets.token_hex(12), inputs=inputs, normalize=normalize)
    try:
        plane, rs, _ = await _submit(request, name, endpoint, plane_of(request).embed(name, msg), False)
    finally:
        if on_close is not None:
            on_close()
    _observe(plane, rs, endpoint, 200)
    assert rs.embeddings is not None
    return rs, rs.embeddings
