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
from corral.api.core.target import Target
from corral.control.plane import ControlPlane
from corral.control.scheduling.pool import ModelPool
from corral.control.stream import RequestStream
from corral.errors import InvalidRequest
from corral.model.settings import LORA_SCALE_MAX, MAX_LORA, LoraAdapter

__all__ = ["LoraIn", "LoraList", "route", "set_defaults", "current_scales", "to_wire"]


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


def route(target: Target, req: wire.GenerateRequest) -> wire.GenerateRequest:
    """``req`` with its adapter scales settled for ``target`` (resolved once: api/core/target.py)."""
    pool = target.pool
    if req.lora:
        for e in req.lora:
            _index(pool.spec.lora, e.id, pool.spec.id)
        return req
    scales = target.implied if target.implied is not None else pool.lora_defaults
    return req if scales is None else msgspec.structs.replace(req, lora=scales)


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


async def generate_routed(plane: ControlPlane, target: Target, req: wire.GenerateRequest,
                          prefix: str | None, cache_salt: str | None = None) -> RequestStream:
    """``plane.generate`` after ``route``: adapter scales, adapter model ids."""
    return await plane.generate(target.pool, route(target, req), prefix, cache_salt)
