"""A request as its worker's frame: encoded after the wire's bounds are checked, and the
name of the body field that held its input (for the worker's error messages)."""

from __future__ import annotations

from corral import wire
from corral.errors import InvalidRequest

__all__ = ["encode_request", "input_param"]


def encode_request(msg: wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest) -> bytes:
    """The request's frame, checked against the wire's bounds (the routes check the
    fields they own with their own names first)."""
    bad = wire.invalid_field(msg)
    if bad is not None:
        path, text = bad
        raise InvalidRequest(f"{path}: {text}", param=path.split(".")[-1] or None)
    try:
        return wire.encode(msg)
    except (OverflowError, ValueError, TypeError) as exc:  # bounds are checked before; belt and braces
        raise InvalidRequest(f"the request cannot be sent to the worker: {exc}") from None


def input_param(msg: wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest) -> str:
    """The OpenAI body field that held this request's input, for error messages."""
    if isinstance(msg, wire.EmbedRequest):
        return "input" if msg.query is None else "documents"
    if isinstance(msg, wire.TokenizeRequest):
        return "content" if msg.text is not None else "tokens" if msg.tokens is not None else "messages"
    if msg.infill is not None:
        return "input_prefix"
    return "messages" if msg.messages is not None else "prompt"
