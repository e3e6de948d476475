"""A model's host memory, as admission budgets it (``memory_budget``): what its live
instances report (a GPU fit plan's host part, else weights + KV), and before a load what it
will take: the last reported per-instance footprint, else its files (the weights and the
vision projector, corral.store.projector)."""

from __future__ import annotations

from corral.control.scheduling.pool import ModelPool

__all__ = ["memory_bytes", "instance_estimate", "estimate_bytes"]


def memory_bytes(pool: ModelPool) -> int:
    """Reported host bytes of ``pool``'s live instances; the estimate for one still loading."""
    total = 0
    for i in pool.live():
        m = i.info.fit.host_bytes if i.info is not None and i.info.fit is not None else i.memory_bytes
        total += m if m is not None else instance_estimate(pool)
    return total


def instance_estimate(pool: ModelPool) -> int:
    """One instance: its last reported footprint, else the size of its files."""
    if pool.footprint is not None:
        return pool.footprint
    try:
        return pool.spec.path.stat().st_size + pool.spec.projector_bytes()
    except OSError:
        return 0


def estimate_bytes(pool: ModelPool) -> int:
    """Every instance of the model."""
    return instance_estimate(pool) * pool.spec.instances
