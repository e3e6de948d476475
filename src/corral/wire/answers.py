"""A request's answers on the wire, worker -> router: a generation's ``Delta`` frames then
its ``Finished`` (with ``Usage`` and ``Timings``), an embedding's ``Embeddings``, a
tokenization's ``Tokenized``, or ``RequestFailed`` for any of them. Imports only
``corral.wire.requests`` (a delta's tool calls are ``ToolCall``s).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.wire.requests import ToolCall

__all__ = ["FinishReason", "FailureCode", "TopLogprob", "TokenLogprob", "Delta", "Usage", "Timings", "Finished",
           "RequestFailed", "Embeddings", "Tokenized"]

FinishReason = Literal["stop", "length", "abort"]
FailureCode = Literal[
    "context_length_exceeded",  # prompt does not fit the slot's context
    "invalid_request",  # e.g. embeddings asked of a generation-only model
    "internal",  # the engine failed on this request; the worker goes on
    "over_token_budget",  # the prompt alone is more than the request's token_budget
]


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    token: bytes  # the token's piece
    logprob: float
    id: int = -1


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One token's log-probability (log-softmax of the model's logits) and its top
    alternatives, most likely first. ``logprob`` is None for a prompt's first token."""

    token: bytes
    logprob: float | None
    top: list[TopLogprob] = []
    id: int = -1


class Delta(msgspec.Struct, frozen=True, tag="delta", omit_defaults=True):
    """New output for a request. ``text`` is always whole UTF-8 characters and never
    contains (a prefix of) a stop string that may still complete. ``logprobs``: one per
    token this delta covers (requests that asked). ``tool_calls``: calls parsed out of
    the output (their text is not in ``text``)."""

    id: str
    text: str
    n_tokens: int  # tokens this delta covers
    logprobs: list[TokenLogprob] = []
    tool_calls: list[ToolCall] = []
    reasoning: str = ""  # thinking text (never in ``text``; its tags in neither)


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the slot's KV cache
    reasoning_tokens: int = 0  # of completion_tokens, drawn inside the thinking


class Timings(msgspec.Struct, frozen=True):
    prompt_ms: float
    predicted_ms: float
    prompt_per_second: float
    predicted_per_second: float
    queued_ms: float = 0.0  # waiting inside the worker for a slot
    grammar_ms: float = 0.0  # spent checking and resampling with a grammar (constrained requests)


class Finished(msgspec.Struct, frozen=True, tag="finished"):
    id: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    slot: int = -1
    stop_string: str | None = None  # the stop string that ended it (finish_reason "stop")
    reasoning_budget: int | None = None  # the thinking budget it ran with (-1: none; None: no thinking)


class RequestFailed(msgspec.Struct, frozen=True, tag="request_failed"):
    id: str
    code: FailureCode
    message: str


class Embeddings(msgspec.Struct, frozen=True, tag="embeddings"):
    id: str
    data: list[list[float]]
    prompt_tokens: int


class Tokenized(msgspec.Struct, frozen=True, tag="tokenized"):
    """Answer to TokenizeRequest: the tokens, their pieces, and the text (detokenized)."""

    id: str
    tokens: list[int]
    pieces: list[bytes]
    text: str
