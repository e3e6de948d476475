"""llama.cpp's /tokenize and /detokenize, and vLLM's /tokenizer_info, answered by a worker
of the named model (its vocabulary). ``model`` may be left out when only one model is
configured.

    POST /tokenize   {"model", "content", "add_special": false, "parse_special": true, "with_pieces": false}
                  -> {"tokens": [ids]}  or, with_pieces, {"tokens": [{"id", "piece"}]}
                     (piece: text, or its bytes as a list of ints when not valid UTF-8)
                     vLLM's names are accepted too: "prompt" for "content",
                     "add_special_tokens" for "add_special"
    POST /detokenize {"model", "tokens": [ids]} -> {"content": text, "prompt": text (vLLM's name)}
    GET  /tokenizer_info[?model=...]   (a loaded model's; a GET loads nothing: 400 model_not_loaded)
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
from corral.api.core.target import resolve
from corral.api.http import json_response, model_or_only, plane_of
from corral.api.core.schemas import parse_body
from corral.errors import InvalidRequest, ModelNotLoaded

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


async def _run(request: Request, name: str | None, msg_kw: dict[str, Any]) -> wire.Tokenized:
    plane = plane_of(request)
    target = resolve(request, _model(plane, name), "tokenize", adapters=False)
    msg = wire.TokenizeRequest(id="tok-" + secrets.token_hex(8), **msg_kw)
    [stream] = await submit(request, target, "tokenize", [plane.tokenize(target.pool, msg)], wait_all=True)
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
    return json_response({"content": t.text, "prompt": t.text})


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> Response:
    """From the load report (wire.ModelInfo) of a running instance: a GET loads nothing (an
    ``<img>`` on any web page can send one), so a model not loaded is a 400
    ``model_not_loaded`` saying how to load it."""
    plane = plane_of(request)
    target = resolve(request, _model(plane, model), "tokenizer_info", adapters=False)
    pool, name = target.pool, target.id
    info = next((i.info for i in pool.instances if i.info is not None), None)
    if info is None:
        raise ModelNotLoaded(f"model {name!r} is not loaded, and a GET does not load it: send it a request "
                             "or POST /models/load, then ask again", param="model")
    if info.tokenizer is None:
        raise InvalidRequest(f"model {name!r}: its worker did not report its tokenizer", param="model")
    t = info.tokenizer
    return json_response({
        "model": pool.spec.id, "bos_token": t.bos_token or None, "eos_token": t.eos_token or None,
        "eot_token": t.eot_token or None, "pad_token": t.pad_token or None,
        "add_bos_token": t.add_bos, "add_eos_token": t.add_eos, "add_bos": t.add_bos,
        "chat_template": t.chat_template,
        "model_max_length": info.n_ctx_slot, "vocab_size": info.n_vocab})
