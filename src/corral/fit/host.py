"""A load with no GPU layers: the context the host can hold (``host_ctx``) and what the
weights and KV take there (``host_bytes``). The worker sizes its context with it when it
has no GPU (``worker/fit.py``'s ``fit_host_ctx``); the page's estimate
(``corral.fit.estimate``) says the same before a download or a load.

The context (each slot capped at the model's ``n_ctx_train``) comes down in whole slots of
256 cells, not below ``fit_ctx_floor`` a slot, until the weights and KV take at most half of
the host's available memory. Neutral: imports only ``settings`` and the ``fit`` modules.
"""

from __future__ import annotations

from corral.fit.layout import ModelLayout
from corral.fit.plan import has_side_context, placement
from corral.fit.rows import outputs_max
from corral.model.settings import ModelSettings

__all__ = ["host_bytes", "host_ctx", "mem_available_bytes"]

_CTX_STEP = 256


def mem_available_bytes() -> int | None:
    """This machine's ``MemAvailable`` (/proc/meminfo), None where there is none."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_bytes(layout: ModelLayout, s: ModelSettings, cells: int) -> int:
    """Weights and KV in host RAM with ``cells`` KV cells in all, nothing offloaded."""
    n = s.slots_asked() or 1  # resolved before (fit.slots.with_slots) where it was "auto"
    parts = placement(layout, gpus=[], weights=None, ngl=0, ctx=cells, n_slots=n, n_ubatch=min(s.n_batch, 512),
                      cache_types=(s.cache_type_k, s.cache_type_v), outputs=outputs_max(s, n),
                      side=has_side_context(s))
    return sum(p.weight_bytes + p.kv_bytes for p in parts)


def host_ctx(layout: ModelLayout, s: ModelSettings, available: int | None) -> int:
    """The KV cells of a load with no GPU; ``layout`` as the KV cache is sized (``kv_sized``);
    ``available`` None: as asked (capped at ``n_ctx_train``)."""
    n = s.slots_asked() or 1  # resolved before (fit.slots.with_slots) where it was "auto"
    ctx = layout.trained_ctx(s.ctx_len, n)
    if available is None:
        return ctx
    step = _CTX_STEP * n
    floor = min(ctx, max(step, s.fit_ctx_floor * n))
    while ctx > floor and host_bytes(layout, s, ctx) > available // 2:
        ctx = max(floor, (ctx - 1) // step * step)
    return ctx
