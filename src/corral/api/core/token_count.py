"""Counting a chat's prompt tokens without a generation slot: the worker renders the messages
with the model's chat template, then tokenizes that text (two ``TokenizeRequest``s, which
skip the slots and the queue behind generations). For /v1/responses/input_tokens and
/v1/messages/count_tokens. Images are not counted (they are tokens only once encoded)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from pydantic import ValidationError
from starlette.requests import Request

from corral import wire
from corral.api.core.chat_request import ChatCompletionRequest
from corral.api.core.submit import observe, submit
from corral.api.core.target import Target, resolve
from corral.api.http import invalid_request, plane_of
from corral.errors import InvalidRequest

if TYPE_CHECKING:
    from corral.control.scheduling.pool import ModelPool

__all__ = ["count_chat_tokens"]


def _starts_with_bos(pool: ModelPool, text: str) -> bool:
    """Whether the rendered chat carries its BOS already (else the worker adds one, as for generation)."""
    for inst in pool.instances:
        t = inst.info.tokenizer if inst.info is not None else None
        if t is not None:
            return bool(t.bos_token) and text.startswith(t.bos_token)
    return False


async def count_chat_tokens(request: Request, chat: dict[str, object], endpoint: str,
                            target: Target | None = None) -> tuple[str, int]:
    """(the model's id, the prompt's token count) of an OpenAI chat request body ``chat``;
    ``target``: its model, when the caller resolved it already (api/core/target.py)."""
    try:
        body = ChatCompletionRequest.model_validate(chat)
    except ValidationError as exc:
        raise invalid_request(exc.errors(include_url=False)) from None
    plane = plane_of(request)
    if target is None:
        target = resolve(request, str(chat["model"]), endpoint, adapters=False)
    render = wire.TokenizeRequest(id="cnt-" + secrets.token_hex(8), messages=body.wire_messages(),
                                  tools=body.wire_tools())
    [stream] = await submit(request, target, endpoint, [plane.tokenize(target.pool, render)], wait_all=True)
    if stream.tokenized is None:
        raise InvalidRequest(f"model {target.id!r} could not render this chat", param="model")
    text = stream.tokenized.text
    count = wire.TokenizeRequest(id="cnt-" + secrets.token_hex(8), text=text,
                                 add_special=not _starts_with_bos(target.pool, text), parse_special=True)
    [stream] = await submit(request, target, endpoint, [plane.tokenize(target.pool, count)], wait_all=True)
    observe(plane, stream, endpoint, 200)
    assert stream.tokenized is not None
    return stream.model, len(stream.tokenized.tokens)
