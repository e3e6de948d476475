"""llama.cpp's /tokenize and /detokenize, and vLLM's /tokenizer_info, answered by a worker
of the named model (its vocabulary). ``model`` may be left out when only one model is
configured.

    POST /tokenize   {"model", "content", "add_special": false, "parse_special": true, "with_pieces": false}
                  -> {"tokens": [ids]}  or, with_pieces, {"tokens": [{"id", "piece"}]}
                     (piece: text, or its bytes as a list of ints when not valid UTF-8)
                     vLLM's names are accepted too: "prompt" for "content",
                     "add_special_tokens" for "add_special"
    POST /detokenize {"model", "tokens": [ids]} -> {"content": text, "prompt": text (vLLM's name)}
    GET  /tokenizer_info[?model=...]
                  -> {"model", "bos_token", "eos_token", "eot_token", "pad_token" (null where the
                      vocabulary has none), "add_bos_token", "add_eos_token" (vLLM's names), "add_bos"
                      (llama.cpp's: the same as add_bos_token), "chat_template"
                      (null: corral's plain User:/Assistant: turns), "model_max_length" (tokens
                      per request), "vocab_size"}

What lm-evaluation-harness's remote tokenizer reads (``tokenizer_backend=remote``, chosen
by itself for ``local-completions`` when /tokenizer_info answers with an ``eos_token``):
the special tokens, which it then tokenizes through /tokenize to get their ids, and the
chat template. ``add_bos_token`` tells such a client whether to put the BOS id in front
of a prompt it sends as token ids: corral sends token-id prompts as they are, as
llama-server does.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from starlette.responses import Response

from corral import wire
from corral.api.core.submit import observe, submit
from corral.api.core.target import Target, resolve
from corral.api.http import json_response, model_or_only, plane_of
from corral.api.core.schemas import parse_body
from corral.control.stream import RequestStream
from corral.errors import InvalidRequest

__all__ = ["router", "BODIES"]

router = APIRouter()
_LENIENT = ConfigDict(extra="ignore")


class TokenizeBody(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    content: str = Field(validation_alias=AliasChoices("content", "prompt"))
    add_special: bool = Field(False, validation_alias=AliasChoices("add_special", "add_special_tokens"))
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeBody(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    tokens: list[Annotated[int, Field(ge=0)]]


BODIES: dict[tuple[str, str], type[BaseModel]] = {("post", "/tokenize"): TokenizeBody,
                                                  ("post", "/detokenize"): DetokenizeBody}


_model = model_or_only


async def _stream(request: Request, name: str | None, msg_kw: dict[str, Any]) -> tuple[Target, RequestStream]:
    plane = plane_of(request)
    target = resolve(request, _model(plane, name), "tokenize", adapters=False)
    msg = wire.TokenizeRequest(id="tok-" + secrets.token_hex(8), **msg_kw)
    [stream] = await submit(request, target, "tokenize", [plane.tokenize(target.pool, msg)], wait_all=True)
    observe(plane, stream, "tokenize", 200)
    return target, stream


async def _run(request: Request, name: str | None, msg_kw: dict[str, Any]) -> wire.Tokenized:
    _, stream = await _stream(request, name, msg_kw)
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
    return json_response({"content": t.text, "prompt": t.text})


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> Response:
    # an empty tokenize on the one request path: loads the model if it is not (autoload),
    # and names the instance whose load report (wire.ModelInfo) describes its vocabulary
    target, stream = await _stream(request, model, {"text": ""})
    pool, name = target.pool, target.id
    inst = next((i for i in pool.instances if i.index == stream.instance_index and i.info is not None), None)
    info = inst.info if inst is not None else None
    if info is None or info.tokenizer is None:
        raise InvalidRequest(f"model {name!r}: its worker did not report its tokenizer", param="model")
    t = info.tokenizer
    return json_response({
        "model": pool.spec.id, "bos_token": t.bos_token or None, "eos_token": t.eos_token or None,
        "eot_token": t.eot_token or None, "pad_token": t.pad_token or None,
        "add_bos_token": t.add_bos, "add_eos_token": t.add_eos, "add_bos": t.add_bos,
        "chat_template": t.chat_template,
        "model_max_length": info.n_ctx_slot, "vocab_size": info.n_vocab})
