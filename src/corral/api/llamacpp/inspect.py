"""llama-server's inspection routes, per model (``?model=`` as in its router mode; left
out when one model is configured):

    GET  /props            the model's context, slots, chat template, BOS/EOS, modalities
    GET  /slots            each slot of the model's running instances (ids numbered across them)
    POST /apply-template   {"messages", "tools"?} -> {"prompt": the chat as the model's template renders it}

/props and /slots read; neither loads a model (a model not loaded shows its configured
context and slots, and no slots). /slots shows counts, never a prompt or output.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import msgspec

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from corral import __version__, wire
from corral.api.core.chat_request import ChatCompletionRequest
from corral.api.core.submit import observe, submit
from corral.api.core.target import resolve
from corral.api.core.schemas import parse_body
from corral.api.http import invalid_request, json_response, plane_of
from corral.api.llamacpp.schemas import SPELLING, ApplyTemplateBody, model_for
from corral.control.capabilities import can
from corral.control.generation_defaults import in_force
from corral.control.scheduling.pool import ModelPool
from corral.model.settings import SAMPLING_KEYS, ModelSettings

__all__ = ["router"]

router = APIRouter()


def _info(pool: ModelPool) -> wire.ModelInfo | None:
    return next((i.info for i in pool.instances if i.info is not None), None)


def generation_settings(spec: ModelSettings) -> dict[str, Any]:
    """The defaults in force, as llama-server names them in the ``params`` of
    ``default_generation_settings`` (``n_predict`` -1: no limit; ``seed`` -1: random)."""
    g = in_force(spec)
    out = {k: g[k] for k in SAMPLING_KEYS}
    out[SPELLING["max_tokens"]] = -1 if g["max_tokens"] is None else g["max_tokens"]
    out.update(seed=-1 if g["seed"] is None else g["seed"], chat_template_kwargs=g["chat_template_kwargs"])
    return out


def _slot_body(s: wire.SlotState, slot_id: int) -> dict[str, Any]:
    return {"id": slot_id, "id_task": -1 if not s.is_processing else slot_id, "n_ctx": s.n_ctx,
            "speculative": False, "is_processing": s.is_processing,
            "n_prompt_tokens": s.n_prompt_tokens, "n_prompt_tokens_cache": s.n_prompt_tokens_cache,
            "n_cached": s.n_cached,
            "next_token": [{"has_next_token": s.is_processing, "has_new_line": False, "n_remain": s.n_remain,
                            "n_decoded": s.n_decoded}]}


@router.get("/props")
async def props(request: Request, model: str | None = None) -> Response:
    plane = plane_of(request)
    visible = plane.visible_pools()
    if not model and len(visible) > 1:  # llama-server's router mode: the router's own props
        return json_response({"role": "router", "build_info": f"corral-{__version__}",
                              "models": sorted(p.spec.id for p in visible)})
    pool = plane.pool(model_for(plane, model))
    spec = pool.spec
    info = _info(pool)
    n_ctx = info.n_ctx_slot if info else spec.slot_ctx()
    slots = info.n_slots if info else spec.slots_asked() or 1
    return json_response({
        "default_generation_settings": {"id": 0, "id_task": -1, "n_ctx": n_ctx, "speculative": False,
                                        "is_processing": False,
                                        "params": generation_settings(spec)},
        "total_slots": slots * max(1, spec.instances),
        # how the slots were sized (n_parallel = "auto": from memory, corral/fit/slots.py); None before a load
        "slots_plan": msgspec.to_builtins(info.slot_plan) if info and info.slot_plan else None,
        "model_alias": spec.id, "model_path": str(spec.path), "is_loaded": info is not None,
        "modalities": {"vision": can(pool, "vision"), "audio": can(pool, "audio")},
        "chat_template": (info.tokenizer.chat_template if info and info.tokenizer else None) or spec.chat_template or "",
        "bos_token": info.tokenizer.bos_token if info and info.tokenizer else "",
        "eos_token": info.tokenizer.eos_token if info and info.tokenizer else "",
        "embedding": info.embedding if info else spec.embedding, "pooling": info.pooling if info else "",
        "infill": info.fim if info else False,
        "build_info": f"corral-{__version__}"})


@router.get("/slots")
async def slots(request: Request, model: str | None = None) -> Response:
    plane = plane_of(request)
    pool = plane.pool(model_for(plane, model))
    live = [i for i in pool.instances if i.info is not None]
    reports = await asyncio.gather(*(i.fetch_stats() for i in live))
    out: list[dict[str, Any]] = []
    for stats in reports:
        for s in (stats.slots if stats is not None else []):
            out.append(_slot_body(s, len(out)))
    return json_response(out)


@router.post("/apply-template")
async def apply_template(request: Request) -> Response:
    body = await parse_body(request, ApplyTemplateBody)
    plane = plane_of(request)
    model = model_for(plane, body.model)
    try:
        chat = ChatCompletionRequest.model_validate({"model": model, "messages": body.messages, "tools": body.tools})
    except ValidationError as exc:
        raise invalid_request(exc.errors(include_url=False)) from None
    msg = wire.TokenizeRequest(id="tpl-" + secrets.token_hex(8), messages=chat.wire_messages(),
                               tools=chat.wire_tools())
    target = resolve(request, model, "apply_template", adapters=False)
    [stream] = await submit(request, target, "apply_template", [plane.tokenize(target.pool, msg)], wait_all=True)
    observe(plane, stream, "apply_template", 200)
    assert stream.tokenized is not None
    return json_response({"prompt": stream.tokenized.text})
