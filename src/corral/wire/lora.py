"""LoRA adapters on the wire: a request's adapter scales and what a worker loaded.
Part of ``corral.wire`` (which re-exports these; import them from there). Imports only
``corral.model.settings`` and the wire's gpu topic (``BufferSize``).

``LoraScale``: one entry of a request's ``lora`` (llama-server's ``[{id, scale}]``): ``id``
is the adapter's position in the model's ``lora`` list (llama-server's integer id) or its
configured name. A request that lists adapters runs with those scales and every other adapter
at 0 (llama-server's rule); ``None`` or ``[]``: the model's default scales.

``LoraAdapterInfo``: one loaded adapter, as ``ModelInfo.lora`` reports it (and ``GET
/lora-adapters`` shows it)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from corral.model.settings import LORA_SCALE_MAX, MAX_LORA
from corral.wire.gpu import BufferSize

__all__ = ["LoraScale", "LoraAdapterInfo", "MAX_LORA"]


class LoraScale(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: Annotated[int, Meta(ge=0, lt=MAX_LORA)] | Annotated[str, Meta(min_length=1, max_length=64)]
    scale: Annotated[float, Meta(ge=-LORA_SCALE_MAX, le=LORA_SCALE_MAX)] = 0.0


class LoraAdapterInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: int  # position in the model's lora list (llama-server's id)
    name: str  # the configured id
    path: str
    scale: float  # the configured default
    bytes: int  # host or device memory its tensors take (counted in ModelInfo.model_bytes)
    buffers: list[BufferSize] = []  # where llama.cpp put them, as it logged it ("Vulkan0 LoRA buffer size")
