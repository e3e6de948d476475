"""The time limit's step feature (``t_max_predict_ms``; the rule: this package's docstring)."""

from __future__ import annotations

import time

from corral import wire
from corral.worker.slots import Job, Slot, StepFeature
from corral.worker.time_limit.state import TimeLimit

__all__ = ["TimeLimitFeature"]


class TimeLimitFeature(StepFeature):
    """``t_max_predict_ms``: a request ends with ``length`` at the first token after a new line once
    its generation has run that long."""

    def admitted(self, slot: Slot, job: Job) -> bool:
        ms = job.req.t_max_predict_ms
        slot.time_limit = TimeLimit(ms / 1000.0) if ms > 0 else None
        return ms > 0

    def token_accepted(self, slot: Slot, token: int, delta: wire.Delta | None) -> wire.FinishReason | None:
        st = slot.time_limit
        if st is None:
            return None
        if delta is not None and "\n" in delta.text:
            st.new_line = True
        if st.new_line and time.perf_counter() - slot.t_first > st.limit_s:
            return "length"
        return None
