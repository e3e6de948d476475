"""LoRA adapters in the worker: loaded once, applied per step to the slots of one adapter set.

A model's ``lora`` setting lists adapter GGUFs; ``LoraAdapters.load`` loads each one on the
model (``llama_adapter_lora_init``) when the engine starts, and a file llama.cpp refuses is a
``ModelLoadError`` naming the adapter (the worker answers ``LoadFailed``), never a crash.
``close`` frees them (before the model).

A request's adapter set (``key_of``) is the tuple of ``(adapter index, scale)`` with a
non-zero scale, from its ``lora`` (llama-server's rule: the listed adapters at their scales,
every other one at 0) or, without one, the model's default scales (each adapter's ``scale``,
but 0 for one that has a ``model`` id of its own). ``()`` is the base model.

llama.cpp applies adapters to a whole context (``llama_set_adapters_lora``), not per
sequence, so a step decodes the slots of ONE adapter set (``turn``): with several sets
busy, the sets take steps in turn (round robin over the sets, in their sorted order), so a
request with no adapter waits at most one step per other busy set, and with one set busy
(the usual case) every slot runs every step, as without adapters. Changing the context's
adapters makes llama.cpp re-reserve its compute graph on the next decode (measured in
docs/benchmarks.md).

A slot's KV is valid only for the adapter set it was computed under: ``Slot.lora`` (a cell
field, ``slots.CELL_FIELDS``) is the set of a slot's cells and ``Job.lora`` the set a request
runs with (``key_of``, at submit); the one slot picker (``slots.pick_slot``) reuses a cached
prefix only from a slot of the job's own set (another slot's cells are saved by the prompt
cache, then cleared, when the job starts there; ``PromptCache.admit`` then gives the slot the
job's set). Anything else that restores KV into a slot compares this key too: the prompt
cache keys its entries by it (worker/cache/prompt_cache.py), as do slot files and preemption.

As a step feature (``StepFeature``, worker/slots.py) the adapters implement one moment,
``before_batch`` (``turn``); the engine lists them only when the model has adapters.
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.host.devices import logged_buffers
from corral.worker.llama_context import captured
from corral.worker.model import LoadedModel, ModelLoadError
from corral.worker.lora.state import BASE, LoraKey
from corral.worker.slots import Slot, StepFeature

__all__ = ["LoraAdapters", "LoraKey", "BASE"]

log = logging.getLogger("corral.worker.lora.adapters")


class LoraAdapters(StepFeature):
    """A worker's adapters and the set its context has now; a step feature (``turn``)."""


    def __init__(self, model: LoadedModel, specs: list[wire.LoraAdapterInfo],
                 handles: list[Any], default: LoraKey = BASE) -> None:
        self.m = model
        self.specs = specs
        self.handles = handles
        self.names = {s.name: s.id for s in specs}
        self.default = default
        self.applied: LoraKey = BASE
        self.last_turn: LoraKey | None = None
        self.switches = 0  # times the context's adapters changed
        self._arrays = (ll.llama_adapter_lora_p_ctypes * max(1, len(handles)))(*handles)
        if self.default:
            self._apply(self.default)  # embeddings and anything outside turn() see the defaults

    @classmethod
    def load(cls, m: LoadedModel, settings: wire.WorkerSettings) -> "LoraAdapters":
        """Load every configured adapter on ``m``; ``ModelLoadError`` (after freeing what was
        loaded, and the model) if one cannot be."""
        handles: list[Any] = []  # llama_adapter_lora pointers
        specs: list[wire.LoraAdapterInfo] = []
        try:
            for i, a in enumerate(settings.lora):
                if not os.path.isfile(a.path):
                    raise ModelLoadError(f"LoRA adapter {a.id!r}: no such file {a.path}")
                with captured() as lines:  # "Vulkan0 LoRA buffer size = ...": where its tensors went
                    h = ll.llama_adapter_lora_init(m.model, a.path.encode())
                if not h:
                    raise ModelLoadError(f"LoRA adapter {a.id!r}: llama.cpp could not load {a.path} "
                                         "(not a LoRA GGUF, or made for another model)")
                handles.append(h)
                specs.append(wire.LoraAdapterInfo(id=i, name=a.id, path=a.path, scale=a.scale,
                                                  bytes=os.path.getsize(a.path), buffers=logged_buffers(lines)))
            # an adapter with its own model id is not applied to the base model's requests
            default = tuple((i, a.scale) for i, a in enumerate(settings.lora) if a.scale != 0.0 and a.model is None)
            return cls(m, specs, handles, default)
        except BaseException:
            for h in handles:
                ll.llama_adapter_lora_free(h)
            m.free()
            raise

    def report(self, info: wire.ModelInfo) -> wire.ModelInfo:
        """``info`` with the adapters listed and their bytes counted in the weights."""
        if not self.specs:
            return info
        import msgspec

        return msgspec.structs.replace(info, lora=self.specs,
                                       model_bytes=info.model_bytes + sum(s.bytes for s in self.specs))

    def close(self) -> None:
        if self.handles:
            if self.m.ctx:
                ll.llama_set_adapters_lora(self.m.ctx, None, 0, None)
            for h in self.handles:
                ll.llama_adapter_lora_free(h)
            self.handles = []

    # ------------------------------------------------------------------ requests

    def key_of(self, req: wire.GenerateRequest) -> LoraKey:
        """The adapter set ``req`` runs with; RequestRejected for an unknown adapter."""
        if not req.lora:
            return self.default
        scales: dict[int, float] = {}
        for entry in req.lora:
            idx = self.names.get(entry.id) if isinstance(entry.id, str) else entry.id
            if idx is None or not 0 <= idx < len(self.specs):
                known = ", ".join(f"{s.id} ({s.name})" for s in self.specs) or "none"
                raise RequestRejected("invalid_request",
                                      f"lora: unknown adapter id {entry.id!r} (this model's adapters: {known})")
            scales[idx] = entry.scale
        return tuple((i, s) for i, s in sorted(scales.items()) if s != 0.0)

    def check(self, req: wire.GenerateRequest, has_images: bool) -> None:
        """RequestRejected for an unknown adapter, or for images under an adapter set (an image's
        embeddings decode outside the adapter sets' turns: not supported yet)."""
        if self.key_of(req) != BASE and has_images:
            raise RequestRejected("invalid_request", "images are not supported with LoRA adapters yet: send "
                                                     "\"lora\": [{\"id\": 0, \"scale\": 0}] (no adapter) with them")

    # ------------------------------------------------------------------ the step

    def turn(self, slots: list[Slot]) -> list[Slot]:
        """The slots this step decodes, with the context's adapters set for them."""
        if not self.specs:
            return slots
        groups: dict[LoraKey, list[Slot]] = {}
        for s in slots:
            if s.job is not None:
                groups.setdefault(s.lora, []).append(s)
        if not groups:
            return slots
        if len(groups) == 1:
            key = next(iter(groups))
        else:
            order = sorted(groups)
            last = self.last_turn
            key = next((k for k in order if last is not None and k > last), order[0])
        self.last_turn = key
        self._apply(key)
        return groups[key]

    before_batch = turn  # the step feature's one moment

    def use(self, key: LoraKey) -> None:
        """Set the context's adapters to ``key``'s set for a decode outside the step's turn
        (a paused request's KV recomputed: worker/preempt/preemption.py)."""
        if self.specs:
            self._apply(key)

    def _apply(self, key: LoraKey) -> None:
        if key == self.applied:
            return
        scales = (ctypes.c_float * max(1, len(self.handles)))()
        for i, s in key:
            scales[i] = s
        ll.llama_set_adapters_lora(self.m.ctx, self._arrays, len(self.handles), scales)
        self.applied = key
        self.switches += 1
