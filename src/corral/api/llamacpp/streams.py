"""llama-server's router streams: reading and stopping a stream that outlives its client.

    GET    /v1/stream?conv_id=ID&from=N   the conversation's SSE events from event N (0: all),
                                          then live until it ends (read only: changes nothing)
    DELETE /v1/stream?conv_id=ID          stops its generation (slots free when this answers);
                                          its events stay readable until conversation_ttl_s

A conversation starts with an ``X-Conversation-Id`` header on a streamed chat or completion
(api/core/conversation_stream.py); the buffers are the control plane's
(corral.control.conversations), so the router, not the client, knows the instance. Another
key's conversation is a 404, word for word as an unknown id. A cross-site DELETE is refused
by the guard's Origin check, as every other method is.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral.api.core.conversation_stream import HEADER, conversation_owner
from corral.api.http import json_response, plane_of, sse_stream
from corral.control.conversations import Conversation, check_conversation_id
from corral.errors import InvalidRequest

__all__ = ["router"]

router = APIRouter()


def _conversation(request: Request) -> Conversation:
    raw = request.query_params.get("conv_id")
    if raw is None:
        raise InvalidRequest("conv_id: required query parameter is missing", param="conv_id")
    conv_id = check_conversation_id(raw, "conv_id")
    return plane_of(request).conversations.get(conversation_owner(), conv_id)


@router.get("/v1/stream")
async def replay(request: Request) -> Response:
    conv = _conversation(request)
    raw = request.query_params.get("from", "0")
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidRequest("from: the index of the first event to send, an integer >= 0", param="from")
    response = sse_stream(conv.follow(int(raw)))
    response.headers[HEADER] = conv.conv_id
    return response


@router.delete("/v1/stream")
async def stop(request: Request) -> Response:
    conv = _conversation(request)
    conv = await plane_of(request).conversations.stop(conv.owner, conv.conv_id)
    return json_response({"conv_id": conv.conv_id, "status": conv.status, "events": len(conv.events)})
