"""Ollama's ``options.num_ctx``: the context a chat request runs in, as Ollama sizes it.

A slot's context is fixed when the model loads (``ctx_len / n_parallel``), so a request
cannot grow it; ``num_ctx`` is taken as asked within it (``min(num_ctx, slot)``, never a 400:
aider sends prompt tokens x 1.25 + 8192). When the chat does not fit that context, the
oldest turns go first, as Ollama does: system messages and the last message stay, a tool
call goes with its results; ``truncate: false`` refuses instead (400
``context_length_exceeded`` with the numbers). A context smaller than the slot also caps the
tokens generated (what is left of it after the prompt). The prompt is counted without a
generation slot (corral.api.core.token_count).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from corral.api.core.target import Target
from corral.api.core.token_count import count_chat_tokens
from corral.errors import ContextLengthExceeded

__all__ = ["fit_num_ctx"]


def _chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content") or "")) + len(str(m.get("tool_calls") or "")) for m in messages)


def _drop_oldest(messages: list[dict[str, Any]], n_chars: int) -> list[dict[str, Any]] | None:
    """Without the oldest turns worth at least ``n_chars`` (system messages and the last
    message kept; tool results leave with their call). None: nothing more can go."""
    keep = list(messages)
    dropped = 0
    i = 0
    while dropped < n_chars or dropped == 0:
        while i < len(keep) - 1 and keep[i]["role"] == "system":
            i += 1
        if i >= len(keep) - 1:
            return None if dropped == 0 else keep
        gone = keep.pop(i)
        dropped += max(1, _chars([gone]))
        while i < len(keep) - 1 and keep[i]["role"] == "tool":  # the results of a call that went
            dropped += max(1, _chars([keep.pop(i)]))
    return keep


async def fit_num_ctx(request: Request, target: Target, messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None, num_ctx: int, slot_ctx: int,
                      truncate: bool) -> tuple[list[dict[str, Any]], int | None]:
    """(the messages that fit ``min(num_ctx, slot_ctx)``, the cap on generated tokens or None)."""
    limit = min(num_ctx, slot_ctx)
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    _, n = await count_chat_tokens(request, {"model": target.id, "messages": messages, **extra}, "ollama_chat", target)
    while n >= limit:
        if not truncate:
            raise ContextLengthExceeded(f"the prompt has {n} tokens, but the context is {limit} tokens "
                                        f"(options.num_ctx {num_ctx}, this model's slot {slot_ctx}); "
                                        "truncate: true drops the oldest turns", param="messages")
        per_token = max(1.0, _chars(messages) / max(n, 1))
        fewer = _drop_oldest(messages, int((n - limit + 1) * per_token))
        if fewer is None:
            raise ContextLengthExceeded(f"the system prompt and the last message alone have {n} tokens, "
                                        f"but the context is {limit} tokens (options.num_ctx {num_ctx}, "
                                        f"this model's slot {slot_ctx})", param="messages")
        messages = fewer
        _, n = await count_chat_tokens(request, {"model": target.id, "messages": messages, **extra}, "ollama_chat",
                                       target)
    return messages, (limit - n if limit < slot_ctx else None)
