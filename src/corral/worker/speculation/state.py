"""A slot's speculation state (``Slot.spec``): plain data, below ``corral.worker.slots``."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PAUSE_STEPS", "SlotSpec"]

PAUSE_STEPS = 16  # the first pause; doubles after each pause that did not help


@dataclass
class SlotSpec:
    """One slot's speculation state."""

    on: bool = False
    cap: int = 0  # the longest draft tried now (adapts between draft_min and draft_max)
    hits: float = 3.0  # decayed count of accepted draft tokens ...
    tries: float = 4.0  # ... and of draft tokens judged (accepted, or the first rejected)
    draft: list[int] = field(default_factory=list)  # this step's draft
    base: int = 0  # the pending token's position this step
    fails: int = 0
    pause: int = 0  # steps left without drafting
    pause_len: int = PAUSE_STEPS
    probing: bool = False  # this draft is a probe: no length paid (cost.best_length)
    n_gen: int = 1  # slots generating when the length was chosen
