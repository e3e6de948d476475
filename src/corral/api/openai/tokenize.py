"""llama.cpp's /tokenize and /detokenize, answered by a worker of the named model
(its vocabulary). ``model`` may be left out when only one model is configured.

    POST /tokenize   {"model", "content", "add_special": false, "parse_special": true, "with_pieces": false}
                  -> {"tokens": [ids]}  or, with_pieces, {"tokens": [{"id", "piece"}]}
                     (piece: text, or its bytes as a list of ints when not valid UTF-8)
    POST /detokenize {"model", "tokens": [ids]} -> {"content": text}
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from corral import wire
from corral.api.core.generation import observe, submit
from corral.api.http import json_response, plane_of
from corral.api.core.schemas import parse_body
from corral.control.plane import ControlPlane
from corral.errors import InvalidRequest

__all__ = ["router", "BODIES"]

router = APIRouter()
_LENIENT = ConfigDict(extra="ignore")


class TokenizeBody(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    tokens: list[Annotated[int, Field(ge=0)]]


BODIES: dict[tuple[str, str], type[BaseModel]] = {("post", "/tokenize"): TokenizeBody,
                                                  ("post", "/detokenize"): DetokenizeBody}


def _model(plane: ControlPlane, name: str | None) -> str:
    if name:
        return name
    if len(plane.pools) == 1:
        return next(iter(plane.pools))
    raise InvalidRequest("model: required field is missing (more than one model is configured; "
                         "GET /v1/models lists them)", param="model")


async def _run(request: Request, name: str | None, msg_kw: dict[str, Any]) -> wire.Tokenized:
    plane = plane_of(request)
    model = _model(plane, name)
    msg = wire.TokenizeRequest(id="tok-" + secrets.token_hex(8), **msg_kw)
    [stream] = await submit(request, model, "tokenize", [plane.tokenize(model, msg)], wait_all=True)
    observe(plane, stream, "tokenize", 200)
    assert stream.tokenized is not None
    return stream.tokenized


def _piece(b: bytes) -> str | list[int]:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    body = await parse_body(request, TokenizeBody)
    t = await _run(request, body.model, {"text": body.content, "add_special": body.add_special,
                                         "parse_special": body.parse_special})
    if body.with_pieces:
        return json_response({"tokens": [{"id": i, "piece": _piece(p)} for i, p in zip(t.tokens, t.pieces)]})
    return json_response({"tokens": t.tokens})


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    body = await parse_body(request, DetokenizeBody)
    t = await _run(request, body.model, {"tokens": body.tokens})
    return json_response({"content": t.text})
