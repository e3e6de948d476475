"""Token logprobs from the worker (``wire.TokenLogprob``) in OpenAI's two shapes.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`` (parallel
lists; ``top_logprobs`` entries map token text -> logprob; a prompt's first token,
echoed, has logprob null; ``text_offset`` indexes into the text returned).
"""

from __future__ import annotations

from typing import Any

from corral import wire

__all__ = ["chat_logprobs", "completion_logprobs", "token_text"]


def token_text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


def chat_logprobs(items: list[wire.TokenLogprob]) -> dict[str, Any]:
    content = []
    for t in items:
        content.append({
            "token": token_text(t.token), "logprob": t.logprob, "bytes": list(t.token),
            "top_logprobs": [{"token": token_text(a.token), "logprob": a.logprob, "bytes": list(a.token)}
                             for a in t.top],
        })
    return {"content": content, "refusal": None}


def completion_logprobs(items: list[wire.TokenLogprob], offset: int,
                        echoed: str | None = None) -> tuple[dict[str, Any], int]:
    """The completions shape, and the text offset after these tokens (streaming keeps it).

    ``echoed``: the text returned, when ``items`` begin with the echoed prompt. Offsets
    index into the text returned, so a first token the text does not show (the BOS the
    vocabulary added, listed as ``<bos>``) takes no room."""
    tokens, lps, tops, offsets = [], [], [], []
    for i, t in enumerate(items):
        text = token_text(t.token)
        width = len(text)
        if i == 0 and echoed is not None and t.logprob is None and not echoed.startswith(text):
            width = 0
        tokens.append(text)
        lps.append(t.logprob)
        top: dict[str, float] = {}
        for a in t.top:
            top.setdefault(token_text(a.token), a.logprob)
        tops.append(top if t.top or t.logprob is not None else None)
        offsets.append(offset)
        offset += width
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}, offset
