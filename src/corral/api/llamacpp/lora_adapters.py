"""llama-server's LoRA routes, per model (``?model=``; left out when one model is configured):

    GET  /lora-adapters   [{id, path, scale, task_name, prompt_prefix, name}]: the model's
                          adapters (``lora`` setting) and the scale a request without ``lora`` gets
    POST /lora-adapters   [{id, scale}, ...]: those scales (the others 0) for every later request
                          to the model that names no ``lora`` (scope ``manage``)

Neither loads the model. ``id`` is the adapter's position (llama-server's) or its configured
name. See docs/internals/lora.md.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import RootModel
from starlette.responses import Response

from corral.api.core.lora import LoraIn, LoraList, current_scales, set_defaults, to_wire
from corral.api.core.schemas import parse_body
from corral.api.http import json_response, plane_of
from corral.api.llamacpp.schemas import model_for
from corral.errors import InvalidRequest

__all__ = ["router"]

router = APIRouter()

class _Body(RootModel[LoraList]):
    """llama-server's body: a list of ``{"id", "scale"}``."""


@router.get("/lora-adapters")
async def get_lora_adapters(request: Request, model: str | None = None) -> Response:
    plane = plane_of(request)
    pool = plane.pool(model_for(plane, model))
    scales = current_scales(pool)
    return json_response([{"id": i, "path": a.path, "scale": scales[i], "task_name": "", "prompt_prefix": "",
                           "name": a.id, **({"model": a.model} if a.model else {})}
                          for i, a in enumerate(pool.spec.lora)])


@router.post("/lora-adapters")
async def post_lora_adapters(request: Request, model: str | None = None) -> Response:
    entries: list[LoraIn] = (await parse_body(request, _Body)).root
    plane = plane_of(request)
    pool = plane.pool(model_for(plane, model))
    if not pool.spec.lora:
        raise InvalidRequest(f"model {pool.spec.id!r} has no LoRA adapters (its lora setting is empty)",
                             param="model")
    set_defaults(pool, to_wire(pool, entries))
    return json_response({"success": True})
