"""The per-request collector between a worker's messages and one HTTP response.

The worker's socket reader pushes deltas in (synchronously, no task per token); the
route handler pulls merged text out. If the client reads slower than the worker
produces, pending pieces are joined instead of queued as messages, so memory is the
generated text and nothing more. One waiter future at a time; no per-token allocation
beyond the text itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from corral import wire
from corral.errors import ContextLengthExceeded, CorralError, InvalidRequest, RateLimited, WorkerRequestFailed

__all__ = ["RequestStream", "StreamPiece", "failure_to_error"]

log = logging.getLogger("corral.stream")

_MERGE_AT = 64  # join pending pieces once this many pile up


def failure_to_error(msg: wire.RequestFailed, input_param: str = "messages") -> CorralError:
    """``input_param``: the body field that held the input (messages, prompt, input)."""
    if msg.code == "context_length_exceeded":
        return ContextLengthExceeded(msg.message, param=input_param)
    if msg.code == "invalid_request":
        return InvalidRequest(msg.message)
    if msg.code == "over_token_budget":
        return RateLimited(msg.message, retry_after_s=60.0, kind="tokens")
    return WorkerRequestFailed(f"the model failed on this request: {msg.message}")


class StreamPiece:
    """What a request produced since the consumer last looked: merged text, the logprobs
    of the tokens it covers (requests that asked), tool calls parsed out of the output,
    and the thinking (reasoning models: never part of ``text``)."""

    __slots__ = ("text", "logprobs", "tool_calls", "reasoning")

    def __init__(self, text: str, logprobs: list[wire.TokenLogprob], tool_calls: list[wire.ToolCall],
                 reasoning: str = "") -> None:
        self.text = text
        self.logprobs = logprobs
        self.tool_calls = tool_calls
        self.reasoning = reasoning


class RequestStream:
    """State of one request as the router sees it. Fed by the worker's link, read by the
    API. ``bind`` (when the request is sent) gives it the instance index and how to
    abort it."""

    __slots__ = ("id", "instance_index", "_abort", "_parts", "n_tokens", "_waiter", "finished", "error",
                 "embeddings", "created", "started", "first_token", "ended", "model", "aborted", "_folded",
                 "input_param", "_logprobs", "_tool_calls", "tokenized", "_end_handlers", "_reasoning", "send",
                 "on_pause")

    def __init__(self, request_id: str, model: str, input_param: str = "messages") -> None:
        self.id = request_id
        self.model = model
        self.input_param = input_param
        self.instance_index: int | None = None
        self._abort: Callable[[str], None] | None = None
        self._parts: list[str] = []
        self.n_tokens = 0
        self._waiter: asyncio.Future[None] | None = None
        self.finished: wire.Finished | None = None
        self.error: CorralError | None = None
        self.embeddings: wire.Embeddings | None = None
        self.tokenized: wire.Tokenized | None = None
        self._logprobs: list[wire.TokenLogprob] = []
        self._tool_calls: list[wire.ToolCall] = []
        self._reasoning: list[str] = []
        self.created = time.perf_counter()
        self.started: float | None = None  # handed to a worker
        self.first_token: float | None = None
        self.ended: float | None = None
        self.aborted = False
        self._folded = 0
        self._end_handlers: list[Callable[[RequestStream], None]] = []  # at_end
        # preemption (corral.control.scheduling.preempt): a frame to its worker (the link sets it); its Paused
        self.send: Callable[[wire.Preempt | wire.Resume], bool] | None = None
        self.on_pause: Callable[[wire.Paused], None] | None = None

    def at_end(self, handler: Callable[[RequestStream], None]) -> None:
        """Call ``handler(stream)`` when the request ends (at once if it has): once, on the
        link's reader, before its slot is released. Handlers run last added first, as
        exits do: preemption's, then the fair queue's, then the key's usage
        (``Dispatch._send`` adds them in that order's reverse). One that raises is
        logged; the others still run."""
        if self.done:
            self._run_handler(handler)
        else:
            self._end_handlers.append(handler)

    def _run_handler(self, handler: Callable[[RequestStream], None]) -> None:
        try:  # nothing may escape into the link's reader
            handler(self)
        except Exception:  # noqa: BLE001 - logged; the request's other handlers still run
            log.exception("an end handler of request %s failed", self.id)

    def bind(self, instance_index: int, abort: Callable[[str], None]) -> None:
        """The request was sent to instance ``instance_index``; ``abort(id)`` stops it."""
        self.instance_index = instance_index
        self._abort = abort

    # ------------------------------------------------------------ producer side (sync)

    def on_delta(self, msg: wire.Delta) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter()
        self.n_tokens += msg.n_tokens
        if self.aborted:
            return  # nobody will read it
        if msg.logprobs:
            self._logprobs.extend(msg.logprobs)
        if msg.tool_calls:
            self._tool_calls.extend(msg.tool_calls)
        if msg.reasoning:
            self._reasoning.append(msg.reasoning)
        parts = self._parts
        parts.append(msg.text)
        if len(parts) - self._folded >= _MERGE_AT:  # fold the newest pieces: linear, bounded overhead
            parts[self._folded:] = ["".join(parts[self._folded:])]
            self._folded += 1
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def on_end(self, msg: wire.Finished | wire.RequestFailed | wire.Embeddings | wire.Tokenized) -> None:
        if isinstance(msg, wire.Finished):
            self.finished = msg
        elif isinstance(msg, wire.Embeddings):
            self.embeddings = msg
        elif isinstance(msg, wire.Tokenized):
            self.tokenized = msg
        else:
            self.error = failure_to_error(msg, self.input_param)
        self._end()

    def fail(self, exc: CorralError) -> None:
        if self.done:
            return
        self.error = exc
        self._end()

    def _end(self) -> None:
        self.ended = time.perf_counter()
        handlers, self._end_handlers = self._end_handlers, []
        for handler in reversed(handlers):
            self._run_handler(handler)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def done(self) -> bool:
        return self.ended is not None

    # ------------------------------------------------------------ consumer side

    async def _change(self) -> None:
        """Until the next text or the end (one consumer at a time)."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def next_piece(self) -> StreamPiece | None:
        """What was generated since the last call: text (merged), with the logprobs and
        tool calls that came along; None once finished. Raises the request's error
        (after any text that came before it)."""
        while True:
            parts = self._parts
            if parts:
                self._parts = []
                self._folded = 0
                lps, calls, thought = self._logprobs, self._tool_calls, self._reasoning
                self._logprobs, self._tool_calls, self._reasoning = [], [], []
                return StreamPiece(parts[0] if len(parts) == 1 else "".join(parts), lps, calls, "".join(thought))
            if self.ended is not None:
                if self.error is not None:
                    raise self.error
                return None
            await self._change()

    async def wait_started(self) -> None:
        """Until the first text or the end. Raises the request's error if it failed
        before producing anything (so an HTTP status can still say so)."""
        while not self._parts and self.ended is None:
            await self._change()
        if not self._parts and self.error is not None:
            raise self.error

    async def wait_done(self) -> None:
        """Until the end (text stays pending for ``take_all``). Raises the request's error."""
        while self.ended is None:
            await self._change()
        if self.error is not None:
            raise self.error

    def take_all(self) -> StreamPiece:
        """Everything not yet consumed: text, logprobs, tool calls."""
        parts, lps, calls, thought = self._parts, self._logprobs, self._tool_calls, self._reasoning
        self._parts, self._logprobs, self._tool_calls, self._reasoning = [], [], [], []
        self._folded = 0
        return StreamPiece("".join(parts), lps, calls, "".join(thought))

    def abort(self) -> None:
        """Ask the worker to stop this request. Harmless when done or repeated."""
        if not self.done and self._abort is not None:
            self.aborted = True
            self._parts = []
            self._logprobs = []
            self._tool_calls = []
            self._reasoning = []
            self._abort(self.id)
