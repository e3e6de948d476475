"""Where admission placed one instance on the GPUs: a leaf type shared by the catalog (a
spawn's settings), the instance, the pool and the GPU budget (``corral.control.placement.gpus``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuSlot"]


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """Where admission placed one instance: its GPUs and its estimated need on each."""

    devices: list[int]
    needs: list[int]  # the estimated need on each of ``devices``
    budgets: list[int] | None = None  # what was free of each GPU's budget when placed
    margin_bytes: int | None = None  # [server] gpu_memory_margin
    split: list[float] | None = None  # several GPUs: the split ``needs`` were estimated with (its tensor_split)

    @property
    def need_bytes(self) -> int:
        return sum(self.needs)
