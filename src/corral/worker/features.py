"""The step features a worker runs (``StepFeature``, corral.worker.slots): registered here, one line
each, when the model's settings turn them on; the engine iterates this list only."""

from __future__ import annotations

from corral import wire
from corral.worker.slots import StepFeature
from corral.worker.time_limit.feature import TimeLimitFeature

__all__ = ["step_features"]


def step_features(settings: wire.WorkerSettings) -> list[StepFeature]:
    """The features of an engine with ``settings``, in the order their moments run."""
    features: list[StepFeature] = []
    if not settings.embedding:
        features.append(TimeLimitFeature())  # t_max_predict_ms (per request)
    return features
