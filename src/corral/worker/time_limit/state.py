"""A slot's time limit (``Slot.time_limit``): plain data, below ``corral.worker.slots``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TimeLimit"]


@dataclass
class TimeLimit:
    limit_s: float  # the request's t_max_predict_ms, in seconds
    new_line: bool = False  # the output has had a new line
