"""LoRA adapters on the router side: a request's ``lora`` field, the default scales that
``POST /lora-adapters`` sets, and adapter model ids (Ollama's ``ADAPTER``-style models).

Every dialect's requests pass through ``route`` (``generation._coros``) on their way to the
control plane:

- ``lora: [{id, scale}]`` (llama-server's shape; ``id`` the adapter's position or its
  configured name): checked against the model's ``lora`` setting, an unknown id is a 400
  naming it; the worker runs the listed adapters at those scales, the others at 0.
- no ``lora`` (or ``[]``): the scales ``POST /lora-adapters`` last set for the model, else the
  configured ones (the worker's default).
- a model id that an adapter of another model declares (``lora = [{id, path, scale, model =
  "base-ft"}]``): the base model's workers run it with only that adapter, at its scale (the base
  is loaded once for both ids); the base's own requests do not get that adapter by default.

See docs/internals/lora.md.
"""

from __future__ import annotations

import math
from typing import Annotated

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from corral import wire
from corral.api.core.adapter_models import find_adapter_model
from corral.control.plane import ControlPlane
from corral.control.scheduling.pool import ModelPool
from corral.control.stream import RequestStream
from corral.errors import InvalidRequest, ModelNotFound
from corral.settings import LORA_SCALE_MAX, MAX_LORA, LoraAdapter

__all__ = ["LoraIn", "LoraList", "route", "set_defaults", "current_scales", "adapter_model", "to_wire"]


class LoraIn(BaseModel):
    """One entry of a request's ``lora`` (and of ``POST /lora-adapters``)."""
    model_config = ConfigDict(extra="ignore")
    id: Annotated[int, Field(ge=0, lt=MAX_LORA)] | Annotated[str, Field(min_length=1, max_length=64)]
    scale: float = Field(0.0, ge=-LORA_SCALE_MAX, le=LORA_SCALE_MAX)

    @field_validator("scale")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("scale must be a finite number")
        return v


LoraList = Annotated[list[LoraIn], Field(max_length=MAX_LORA)]

def _index(adapters: list[LoraAdapter], entry_id: int | str, model: str) -> int:
    if isinstance(entry_id, int):
        if entry_id < len(adapters):
            return entry_id
    else:
        for i, a in enumerate(adapters):
            if a.id == entry_id:
                return i
    known = ", ".join(f"{i} ({a.id})" for i, a in enumerate(adapters)) or "none"
    raise InvalidRequest(f"lora: unknown adapter id {entry_id!r} for model {model!r} (its adapters: {known})",
                         param="lora")


def to_wire(pool: ModelPool, entries: list[LoraIn]) -> list[wire.LoraScale]:
    """The entries by adapter position, checked against the model's adapters (400s)."""
    adapters = pool.spec.lora
    return [wire.LoraScale(_index(adapters, e.id, pool.spec.id), e.scale) for e in entries]


def adapter_model(plane: ControlPlane, name: str) -> tuple[ModelPool, int] | None:
    """The base model and adapter position an adapter model id names, if one does and the
    request's key may use it (corral.api.core.adapter_models)."""
    found = find_adapter_model(plane, name)
    return None if found is None else (found.base, found.position)


def _pool(plane: ControlPlane, name: str) -> tuple[ModelPool, list[wire.LoraScale] | None]:
    """The model ``name`` runs on, and the scales an adapter model id implies."""
    try:
        return plane.pool(name), None
    except ModelNotFound:
        found = adapter_model(plane, name)
        if found is None:
            raise
        pool, i = found
        return pool, [wire.LoraScale(i, pool.spec.lora[i].scale)]


def route(plane: ControlPlane, name: str, req: wire.GenerateRequest) -> tuple[str, wire.GenerateRequest]:
    """The model id to send ``req`` to, and ``req`` with its adapter scales settled."""
    pool, implied = _pool(plane, name)
    if req.lora:
        for e in req.lora:
            _index(pool.spec.lora, e.id, pool.spec.id)
        return pool.spec.id if implied is not None else name, req
    scales = implied if implied is not None else pool.lora_defaults
    if scales is None:
        return name, req
    return (pool.spec.id if implied is not None else name), msgspec.structs.replace(req, lora=scales)


def set_defaults(pool: ModelPool, scales: list[wire.LoraScale]) -> None:
    """``POST /lora-adapters``: the listed adapters at these scales, the others at 0, for the
    model's requests that name none (kept on the pool, until the model's settings change)."""
    by_index = {int(s.id): s.scale for s in scales}
    pool.lora_defaults = [
        wire.LoraScale(i, by_index.get(i, 0.0)) for i in range(len(pool.spec.lora))]


def current_scales(pool: ModelPool) -> list[float]:
    """Each adapter's scale for a request that names none."""
    set_ = pool.lora_defaults
    if set_ is None:  # an adapter with a model id of its own is off for the base's requests
        return [a.scale if a.model is None else 0.0 for a in pool.spec.lora]
    return [s.scale for s in set_]


async def generate_routed(plane: ControlPlane, name: str, req: wire.GenerateRequest,
                          prefix: str | None, cache_salt: str | None = None) -> RequestStream:
    """``plane.generate`` after ``route``: adapter scales, adapter model ids."""
    name, req = route(plane, name, req)
    return await plane.generate(name, req, prefix, cache_salt)
