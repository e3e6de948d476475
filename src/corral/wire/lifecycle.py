"""A worker's life on the wire: the settings it is spawned with (``WorkerSettings``, JSON on
argv), its load (``Loading``, then ``Ready`` with the ``ModelInfo`` or ``LoadFailed``), its
``Stats`` when asked (``StatsRequest``) and its ``Shutdown``. Imports only ``corral.model.settings``
and the wire's own topics.
"""

from __future__ import annotations

import msgspec

from corral.model.settings import ModelSettings
from corral.wire.cache import PromptCacheDisk, PromptCacheStats
from corral.wire.editors import SlotState
from corral.wire.model import ModelInfo

__all__ = ["PROTOCOL_VERSION", "WorkerSettings", "Loading", "Ready", "LoadFailed", "StatsRequest", "Stats",
           "Shutdown"]

PROTOCOL_VERSION = 2


class WorkerSettings(ModelSettings, frozen=True, kw_only=True):
    """Everything a worker needs to load one model instance. Passed as JSON on argv.
    The model's settings (``corral.model.settings.ModelSettings``: defaults and bounds live
    there) plus which model file and which instance this spawn is."""

    model_id: str
    model_path: str
    instance: int = 0
    # set by the router when it placed the instance on a GPU (n_gpu_layers "auto" plans within):
    # its share of each GPU's budget, in the order of ``devices`` (an int: the first GPU's;
    # None: the devices' free memory)
    gpu_budget_bytes: list[int] | int | None = None
    gpu_margin_bytes: int | None = None  # kept free on the GPU (None: corral.fit.plan.DEFAULT_MARGIN_BYTES)
    prompt_cache_disk: PromptCacheDisk | None = None  # None: no prompt cache on disk (wire/cache.py)


class Loading(msgspec.Struct, frozen=True, tag="loading"):
    pid: int
    protocol: int = PROTOCOL_VERSION


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    pid: int
    info: ModelInfo


class LoadFailed(msgspec.Struct, frozen=True, tag="load_failed"):
    reason: str


class StatsRequest(msgspec.Struct, frozen=True, tag="stats_request"):
    pass


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown"):
    pass


class Stats(msgspec.Struct, frozen=True, kw_only=True, tag="stats"):
    slots_busy: int
    slots_total: int
    waiting: int  # accepted requests not yet in a slot
    rss_bytes: int
    model_bytes: int
    kv_bytes: int
    tokens_generated: int  # since start
    tokens_prompt: int
    slots: list[SlotState] = []  # each slot's state (GET /slots)
    spec_drafted: int = 0  # draft tokens verified (worker/speculation/speculator.py)
    spec_accepted: int = 0  # of them accepted
    gen_steps: int = 0  # slot-steps that emitted tokens; tokens_generated / gen_steps: tokens per step
    prompt_cache: PromptCacheStats | None = None  # None: no prompt cache (wire/cache.py)
