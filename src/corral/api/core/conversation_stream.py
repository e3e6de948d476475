"""A streamed answer that outlives its client, as llama-server's router does: a request with
an ``X-Conversation-Id`` header keeps generating after the client leaves, its SSE events
kept by the control plane's ``Conversations`` (corral.control.conversations), and
``GET /v1/stream?conv_id=&from=N`` replays them (api/llamacpp/streams.py).

    conv_id = conversation_id(request)                    # before the slot is taken: 400/429 here
    gs = await open_stream(request, spec)
    return sse_answer(request, conv_id, events, gs.streams)  # the body follows the buffer

Without the header nothing changes: the SSE body is the generator itself and a disconnect
aborts the generation (vLLM's rule, api/core/generation.py). A client that leaves before
the first output (queued, loading) still cancels: the conversation starts with the answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import StreamingResponse

from corral.api.http import plane_of, sse_stream
from corral.control.conversations import check_conversation_id
from corral.control.keys.ring import ANONYMOUS_NAME, current_caller
from corral.control.stream import RequestStream

__all__ = ["HEADER", "conversation_id", "conversation_owner", "sse_answer"]

HEADER = "X-Conversation-Id"


def conversation_owner() -> str:
    """The key a conversation belongs to: the request's key's name, ``-`` without keys."""
    caller = current_caller()
    return caller.name if caller is not None else ANONYMOUS_NAME


def conversation_id(request: Request) -> str | None:
    """The request's conversation id (None: an ordinary stream), checked against the key's
    bounds before the request takes a slot (400 for a bad id, 429 over the count)."""
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    conv_id = check_conversation_id(raw.strip())
    plane_of(request).conversations.check(conversation_owner(), conv_id)
    return conv_id


def sse_answer(request: Request, conv_id: str | None, events: AsyncIterator[bytes],
               streams: list[RequestStream]) -> StreamingResponse:
    """The SSE response of ``events``; with a conversation id, drained into the
    conversation (which aborts ``streams`` if it is refused) and followed from its start."""
    if conv_id is None:
        return sse_stream(events)
    try:
        conv = plane_of(request).conversations.start(conversation_owner(), conv_id, events, streams)
    except BaseException:
        for s in streams:
            s.abort()
        raise
    response = sse_stream(conv.follow(0))
    response.headers[HEADER] = conv_id
    return response
