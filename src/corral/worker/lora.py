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

A slot's KV is valid only for the adapter set it was computed under: ``slot_key[i]`` is the
set of slot ``i``'s cache, and ``pick_slot`` reuses a cached prefix only from a slot of the
job's own set (another slot's cache is cleared when the job starts there, as for a prefix of
0). Anything else that restores KV into a slot must compare this key too: the prompt cache
keys its entries by it (worker/prompt_cache.py; ``replaced_key`` is the set of the cells a
chosen slot still holds until its job starts).
"""

from __future__ import annotations

import ctypes
import logging
import os
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.model import LoadedModel, ModelLoadError
from corral.worker.slots import Job, Slot, reuse_len

__all__ = ["LoraAdapters", "LoraKey", "BASE"]

log = logging.getLogger("corral.worker.lora")

LoraKey = tuple[tuple[int, float], ...]  # (adapter index, scale) with scale != 0, by index
BASE: LoraKey = ()


class LoraAdapters:
    """A worker's adapters, the set its context has now, and the set of each slot's KV."""

    def __init__(self, model: LoadedModel, specs: list[wire.LoraAdapterInfo],
                 handles: list[Any], default: LoraKey = BASE) -> None:
        self.m = model
        self.specs = specs
        self.handles = handles
        self.names = {s.name: s.id for s in specs}
        self.default = default
        self.slot_key: list[LoraKey] = [BASE] * model.n_slots
        # the set of a slot's cells before pick_slot gave the slot to a job of another set (the
        # cells stay until the job starts: what the prompt cache saves them under)
        self.replaced_key: list[LoraKey] = [BASE] * model.n_slots
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
                h = ll.llama_adapter_lora_init(m.model, a.path.encode())
                if not h:
                    raise ModelLoadError(f"LoRA adapter {a.id!r}: llama.cpp could not load {a.path} "
                                         "(not a LoRA GGUF, or made for another model)")
                handles.append(h)
                specs.append(wire.LoraAdapterInfo(id=i, name=a.id, path=a.path, scale=a.scale,
                                                  bytes=os.path.getsize(a.path)))
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

    def pick_slot(self, free: list[Slot], job: Job, m: LoadedModel) -> tuple[Slot, int]:
        """``slots.pick_slot`` over the free slots whose KV is of ``job``'s adapter set and cache
        tenant (a slot of another set or tenant serves no prefix); the slot's KV is of that set
        from now on (its tenant changes in ``PromptCache.admit``, which saves the old cells first)."""
        key = self.key_of(job.req) if self.specs else BASE
        tenant = job.req.cache_tenant  # and of the job's cache tenant (docs/internals/prompt-cache.md)
        best, best_n = free[0], -1
        for s in free:
            n = reuse_len(s, job.tokens, m) if self.slot_key[s.index] == key and s.tenant == tenant else 0
            if n > best_n or (n == best_n and len(s.cached) < len(best.cached)):
                best, best_n = s, n
        if self.slot_key[best.index] != key or best.tenant != tenant:
            best_n = 0  # its cache is cleared when the job starts
        self.replaced_key[best.index] = self.slot_key[best.index]
        self.slot_key[best.index] = key
        return best, best_n

    # ------------------------------------------------------------------ the step

    def turn(self, slots: list[Slot]) -> list[Slot]:
        """The slots this step decodes, with the context's adapters set for them."""
        if not self.specs:
            return slots
        groups: dict[LoraKey, list[Slot]] = {}
        for s in slots:
            if s.job is not None:
                groups.setdefault(self.slot_key[s.index], []).append(s)
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

    def use(self, key: LoraKey) -> None:
        """Set the context's adapters to ``key``'s set for a decode outside the step's turn
        (a paused request's KV recomputed: worker/preempt.py)."""
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
