"""The step features a worker runs (``StepFeature``, corral.worker.slots): registered here, one line
each, when the model's settings (or what it loaded) turn them on; the engine iterates this list only.
A feature that is off is not in it, so it costs nothing per step; ``Moments``: the engine-wide
moments, each the features that implement it."""

from __future__ import annotations

from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.batch import Batch
from corral.worker.lora.adapters import LoraAdapters
from corral.worker.cache.prompt_cache import PromptCache
from corral.worker.preempt.preemption import Preemption
from corral.worker.reasoning.feature import ReasoningFeature
from corral.worker.prefill import write_pending
from corral.worker.slots import Slot, StepFeature, overrides, owner
from corral.worker.speculation.speculator import Speculator
from corral.worker.time_limit.feature import TimeLimitFeature
from corral.worker.media.steps import MediaSteps

__all__ = ["Moments", "step_features"]


def step_features(settings: wire.WorkerSettings, media: MediaSteps, lora: LoraAdapters,
                  reasoning: ReasoningFeature, prompt_cache: PromptCache, spec: Speculator,
                  preempt: Preemption) -> list[StepFeature]:
    """The features of an engine with ``settings``, in the order their moments run (the
    engine's loaded parts passed in: each is listed only when it is on)."""
    features: list[StepFeature] = []
    if media.on:
        features.append(media)  # media chunks in the step (before_batch: encodes, pieces; idle)
    if lora.specs:
        features.append(lora)  # before_batch: the slots of one adapter set, in turn
    if reasoning.on:
        features.append(reasoning)  # the thinking's split, budget, forced tokens, held grammar
    if prompt_cache.enabled:
        features.append(prompt_cache)  # finished: the prefill speed (its admit is the slot choice's)
    if not settings.embedding:
        features.append(TimeLimitFeature())  # t_max_predict_ms (per request)
    if spec.mode != "off" and not settings.embedding:
        features.append(spec)  # write_decodes (drafts), draws, taken (after reasoning: its admitted reads the split)
    features.append(preempt)  # paused requests; urgent starts: before_batch (last), decode
    return features


class Moments:
    """For each engine-wide moment of ``features`` the features that implement it, in order
    (the engine iterates only those); a moment marked ``*`` (slots.py) is the one feature's
    method, else the engine's plain path (each slot's pending token; ``Batch.decode``)."""

    def __init__(self, features: list[StepFeature], ctx: ll.llama_context_p) -> None:
        def on(moment: str) -> list[StepFeature]:
            return [f for f in features if overrides(f, moment)]

        def decode(b: Batch, n: int, outputs: list[tuple[Slot, int]], echo_chunks: list[Any]) -> int:
            return b.decode(ctx, n)

        self.before_admit, self.before_batch, self.idle = on("before_admit"), on("before_batch"), on("idle")
        self.abort, self.fail_all, self.has_work = on("abort"), on("fail_all"), on("has_work")
        self.write_decodes = owner(features, "write_decodes", write_pending)
        self.decode = owner(features, "decode", decode)
