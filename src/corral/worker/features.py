"""The step features a worker runs (``StepFeature``, corral.worker.slots): registered here, one line
each, when the model's settings (or what it loaded) turn them on; the engine iterates this list only.
A feature that is off is not in it, so it costs nothing per step."""

from __future__ import annotations

from corral import wire
from corral.worker.lora.adapters import LoraAdapters
from corral.worker.cache.prompt_cache import PromptCache
from corral.worker.reasoning.feature import ReasoningFeature
from corral.worker.slots import StepFeature
from corral.worker.time_limit.feature import TimeLimitFeature
from corral.worker.vision.steps import VisionSteps

__all__ = ["step_features"]


def step_features(settings: wire.WorkerSettings, *, vision: VisionSteps, lora: LoraAdapters,
                  reasoning: ReasoningFeature, prompt_cache: PromptCache) -> list[StepFeature]:
    """The features of an engine with ``settings``, in the order their moments run (the
    engine's loaded parts passed in: each is listed only when it is on)."""
    features: list[StepFeature] = []
    if vision.on:
        features.append(vision)  # images in the step (before_batch: encodes, pieces; idle)
    if lora.specs:
        features.append(lora)  # before_batch: the slots of one adapter set, in turn
    if reasoning.on:
        features.append(reasoning)  # the thinking's split, budget, forced tokens, held grammar
    if prompt_cache.enabled:
        features.append(prompt_cache)  # finished: the prefill speed (its admit is the slot choice's)
    if not settings.embedding:
        features.append(TimeLimitFeature())  # t_max_predict_ms (per request)
    return features
