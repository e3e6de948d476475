"""``n_gpu_layers = "auto"`` at load: the worker's fit to its memory.

With GPUs, ``fit_gpus``: ``corral.fit.plan.plan_fit`` over every GPU this worker sees, each
within the router's share. With none, ``fit_host_ctx``: the context (each slot capped at the
model's ``n_ctx_train``) lowered in whole slots of 256 cells, not below ``fit_ctx_floor`` a
slot, until the weights and KV take at most half of the host's available memory
(``MemAvailable``), so a model whose ``ctx_len`` is not set (32,768 a slot) still loads on a
small machine. A ``ctx_len`` that fits is kept as given.

Before either, ``fit_slots``: ``n_parallel = "auto"``'s slots (``corral.fit.slots.plan_slots``)
on the GPUs the model will be offloaded to, else on the host.
"""

from __future__ import annotations

import logging

from corral import wire
from corral.fit.host import host_ctx
from corral.fit.rows import outputs_max
from corral.fit.layout import GGUFError, ModelLayout, read_layout
from corral.fit.plan import DEFAULT_MARGIN_BYTES, FitError, has_side_context, plan_fit
from corral.fit.slots import plan_slots, with_slots
from corral.worker.host.devices import host_available_bytes, offload_devices

__all__ = ["FitLoadError", "fit_gpus", "fit_host_ctx", "fit_slots", "split_gpus"]

log = logging.getLogger("corral.worker.fit")


class FitLoadError(Exception):
    """No plan: ``str(exc)`` says why (the loader turns it into ``ModelLoadError``)."""


def split_gpus(devices: list[wire.DeviceInfo]) -> list[wire.DeviceInfo]:
    """The GPUs a fit plan and a ``tensor_split`` are over, in llama.cpp's order."""
    return [d for d in offload_devices(devices) if d.kind == "gpu"]


def _limits(s: wire.WorkerSettings) -> list[int | None]:
    """The router's share of each GPU for this instance (others may share the GPUs)."""
    budgets = s.gpu_budget_bytes
    return [budgets] if isinstance(budgets, int) else list(budgets or [])


def fit_slots(s: wire.WorkerSettings, devices: list[wire.DeviceInfo],
              layout: ModelLayout | None) -> tuple[wire.WorkerSettings, wire.SlotPlan]:
    """``s`` with its slots resolved (``n_parallel = "auto"``: planned on the GPUs it will be
    offloaded to, else on the host's available memory; a number set: as it is), and the plan."""
    gpus = [] if s.n_gpu_layers == 0 else split_gpus(devices)
    margin = DEFAULT_MARGIN_BYTES if s.gpu_margin_bytes is None else s.gpu_margin_bytes
    plan = plan_slots(layout, s, gpus=gpus, limits=_limits(s), margin_bytes=margin, tensor_split=s.tensor_split,
                      host_available_bytes=None if gpus else host_available_bytes())
    if plan.asked == "auto":
        log.info("slots: %s", plan.reason)
    return with_slots(s, plan), plan


def fit_gpus(s: wire.WorkerSettings, devices: list[wire.DeviceInfo],
             layout: ModelLayout | None = None) -> wire.FitPlan | None:
    """The plan over every GPU this worker sees (the ones it was pinned to; llama.cpp splits
    the layers over all of them), each within the router's share of it when given (None: no
    GPU). ``layout``: the file's, when already read."""
    gpus = split_gpus(devices)
    if not gpus:
        return None
    try:
        layout = layout or read_layout(s.model_path).kv_sized(s.swa_full).on_devices(gpus)
    except (GGUFError, OSError, ValueError) as exc:
        raise FitLoadError(f"cannot plan GPU layers for {s.model_path}: {exc}") from exc
    margin = DEFAULT_MARGIN_BYTES if s.gpu_margin_bytes is None else s.gpu_margin_bytes
    n_slots = s.slots_asked() or 1
    try:
        return plan_fit(layout, devices=gpus, limits=_limits(s), ctx_len=s.ctx_len, n_slots=n_slots,
                        ctx_floor_per_slot=s.fit_ctx_floor, n_ubatch=min(s.n_batch, 512), margin_bytes=margin,
                        host_available_bytes=host_available_bytes(), tensor_split=s.tensor_split,
                        cache_types=(s.cache_type_k, s.cache_type_v), outputs=outputs_max(s, n_slots),
                        side=has_side_context(s))
    except FitError as exc:
        raise FitLoadError(str(exc)) from exc


def fit_host_ctx(s: wire.WorkerSettings, layout: ModelLayout | None, available: int | None) -> int:
    """The context (KV cells) of a load with no GPU (``corral.fit.host.host_ctx``); ``layout``:
    as the KV cache is sized (``kv_sized``); None (unreadable) or ``available`` None: as asked."""
    n = s.slots_asked() or 1
    if layout is None:
        return s.ctx_len
    want = layout.trained_ctx(s.ctx_len, n)
    ctx = host_ctx(layout, s, available)
    if ctx < want and available is not None:
        log.warning("context %d -> %d cells (%d a slot): weights and KV within half of the host's %d MiB "
                    "available", want, ctx, ctx // n, available >> 20)
    return ctx

