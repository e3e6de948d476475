"""A LoRA adapter set as data (``LoraKey``): what a request runs with (``Job.lora``) and what
a slot's cells were computed under (``Slot.lora``, a cell field). Below ``corral.worker.slots``;
the adapters themselves are ``corral.worker.lora.adapters``."""

from __future__ import annotations

__all__ = ["BASE", "LoraKey"]

LoraKey = tuple[tuple[int, float], ...]  # (adapter index, scale) with scale != 0, by index
BASE: LoraKey = ()  # no adapter: the base model
