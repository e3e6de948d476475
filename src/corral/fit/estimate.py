"""Will a model fit this server, before a byte of it is downloaded or loaded: ``estimate``.

The question the page's search and model cards ask of a GGUF header: with the settings the
model would get (``[defaults]`` for a pulled one, its own for one on disk), on the GPUs'
budgets as ``GET /models`` reports them, and the host's available memory:

- ``gpu``: every layer on the GPU(s), with ``ctx_per_slot`` tokens of context a slot (less
  than asked when ``plan_fit`` had to bring the context down);
- ``partial``: ``gpu_layers`` of ``n_layers`` on the GPU(s), the rest on the host;
- ``host``: no GPU (or none holds even the output head): weights and KV in host RAM, the
  context as the worker sizes it there (``corral.fit.host``: weights and KV within half of
  what is available, down to the ``fit_ctx_floor``);
- ``none``: not even that; ``lacks_bytes`` says by how much.

The GPU side is ``plan_fit`` itself (``n_gpu_layers = "auto"``, as the worker plans its load),
on devices whose free memory is each GPU's budget, with no margin (the budget has it taken
off already). A fixed ``n_gpu_layers`` is reported as the worker would place it. Pure: tested
with made-up devices and layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from corral import wire
from corral.fit.host import host_bytes, host_ctx
from corral.fit.layout import ModelLayout
from corral.fit.plan import FitError, has_side_context, placement, plan_fit
from corral.fit.rows import outputs_max
from corral.fit.slots import plan_slots, with_slots
from corral.fit.split import router_split
from corral.model.settings import ModelSettings

__all__ = ["FitEstimate", "GpuBudget", "estimate", "Verdict"]

Verdict = Literal["gpu", "partial", "host", "none"]
_CTX_STEP = 256


@dataclass(frozen=True, slots=True)
class GpuBudget:
    """One GPU as ``GET /models`` reports it: its name and the bytes corral may use of it."""

    name: str
    budget_bytes: int
    max_tensor_bytes: int = 0  # its backend's largest matrix (0: any); a larger output head stays on the host


@dataclass(frozen=True, slots=True)
class FitEstimate:
    verdict: Verdict
    summary: str  # one line for a person
    gpu_layers: int  # offloaded units (repeating layers + the output head)
    n_layers: int
    ctx_per_slot: int
    ctx_per_slot_asked: int
    n_slots: int
    gpu_bytes: int
    host_bytes: int
    host_available_bytes: int | None
    lacks_bytes: int = 0  # verdict "none": what is missing

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate(layout: ModelLayout, settings: ModelSettings, *, gpus: Sequence[GpuBudget],
             host_available_bytes: int | None) -> FitEstimate:
    """Where ``layout`` would go with ``settings`` on these GPUs and this host (module docstring).
    ``n_parallel = "auto"`` is first resolved as the worker will (``corral.fit.slots``)."""
    kv = layout.kv_sized(settings.swa_full)
    if settings.slots_asked() is None:
        on_gpus = bool(gpus) and settings.n_gpu_layers != 0
        settings = with_slots(settings, plan_slots(
            kv, settings, gpus=_devices(gpus) if on_gpus else (),
            host_available_bytes=None if on_gpus else host_available_bytes))
    n = settings.slots_asked() or 1
    asked = kv.trained_ctx(settings.ctx_len, n)
    common = dict(n_layers=kv.n_layer + 1, n_slots=n, ctx_per_slot_asked=asked // n,
                  host_available_bytes=host_available_bytes)
    ngl = settings.n_gpu_layers
    if gpus and ngl != 0:
        plan = _gpu_plan(kv, settings, gpus, host_available_bytes)
        if isinstance(plan, str):
            budget = sum(max(0, g.budget_bytes) for g in gpus) + (host_available_bytes or 0)
            return _none(kv, settings, plan, budget if host_available_bytes is not None else None, common)
        if plan.n_gpu_layers > 0:
            per_slot = plan.ctx_len // n
            if plan.n_gpu_layers >= kv.n_layer + 1:
                where = " + ".join(g.name for g in gpus)
                summary = f"all {kv.n_layer + 1} layers on {where}, {per_slot} tokens of context a slot ({n} slots)"
                verdict: Verdict = "gpu"
            else:
                summary = (f"{plan.n_gpu_layers} of {kv.n_layer + 1} layers on the GPU, the rest in host RAM; "
                           f"{per_slot} tokens a slot")
                verdict = "partial"
            return FitEstimate(verdict=verdict, summary=summary, gpu_layers=plan.n_gpu_layers,
                               ctx_per_slot=per_slot, gpu_bytes=plan.device_bytes, host_bytes=plan.host_bytes,
                               **common)  # type: ignore[arg-type]
    return _host(kv, settings, host_available_bytes, common)


def _devices(gpus: Sequence[GpuBudget]) -> list[wire.DeviceInfo]:
    """The GPUs as devices whose free memory is corral's budget of them."""
    return [wire.DeviceInfo(index=k, name=g.name, backend="GPU", kind="gpu", free_bytes=max(0, g.budget_bytes),
                            total_bytes=max(0, g.budget_bytes), max_tensor_bytes=g.max_tensor_bytes)
            for k, g in enumerate(gpus)]


def _gpu_plan(layout: ModelLayout, s: ModelSettings, gpus: Sequence[GpuBudget],
              host: int | None) -> wire.FitPlan | str:
    budgets = [max(0, g.budget_bytes) for g in gpus]
    devs = _devices(gpus)
    n_ubatch = min(s.n_batch, 512)
    args: dict[str, Any] = dict(n_ubatch=n_ubatch, cache_types=(s.cache_type_k, s.cache_type_v),
                                outputs=outputs_max(s, (s.slots_asked() or 1)), side=has_side_context(s))
    if s.n_gpu_layers != "auto":  # a fixed number of layers takes what it takes
        ngl = layout.n_layer + 1 if s.n_gpu_layers < 0 else min(s.n_gpu_layers, layout.n_layer + 1)
        parts = placement(layout.on_devices(devs), gpus=devs, weights=router_split(s, budgets, None), ngl=ngl,
                          ctx=layout.trained_ctx(s.ctx_len, (s.slots_asked() or 1)), n_slots=s.slots_asked() or 1,
                          **args)
        gpu = sum(p.weight_bytes + p.kv_bytes + p.compute_bytes for p in parts if p.device != "CPU")
        cpu = sum(p.weight_bytes + p.kv_bytes for p in parts if p.device == "CPU")
        if gpu > sum(budgets):
            return f"{ngl} layers on the GPU need {_gib(gpu)}, the budget is {_gib(sum(budgets))}"
        ctx = layout.trained_ctx(s.ctx_len, (s.slots_asked() or 1))
        return wire.FitPlan(n_gpu_layers=ngl, n_layers=layout.n_layer + 1, ctx_len=ctx, ctx_len_asked=s.ctx_len,
                            device=None, device_bytes=gpu, host_bytes=cpu, free_bytes=sum(budgets),
                            margin_bytes=0, notes="")
    try:
        return plan_fit(layout.on_devices(devs), devices=devs, ctx_len=s.ctx_len, n_slots=s.slots_asked() or 1,
                        ctx_floor_per_slot=s.fit_ctx_floor, margin_bytes=0, host_available_bytes=host,
                        tensor_split=router_split(s, budgets, None), **args)
    except FitError as exc:
        return str(exc)


def _host(layout: ModelLayout, s: ModelSettings, available: int | None, common: dict[str, Any]) -> FitEstimate:
    """No GPU layers: the context as the worker sizes it with no GPU (``corral.fit.host``)."""
    n = (s.slots_asked() or 1)
    want = layout.trained_ctx(s.ctx_len, n)
    ctx = host_ctx(layout, s, available)
    need = host_bytes(layout, s, ctx)
    if available is not None and need > available:
        return _none(layout, s, f"host RAM: needs {_gib(need)}, {_gib(available)} available", available, common)
    cut = f" (asked {want // n})" if ctx < want else ""
    return FitEstimate(verdict="host", summary=f"host RAM only: {_gib(need)}, {ctx // n} tokens a slot{cut}",
                       gpu_layers=0, ctx_per_slot=ctx // n, gpu_bytes=0, host_bytes=need, **common)


def _none(layout: ModelLayout, s: ModelSettings, why: str, room: int | None,
          common: dict[str, Any]) -> FitEstimate:
    """Not even at the context floor: ``lacks_bytes`` is its weights and KV less ``room`` (the
    GPUs' budgets and the host's available memory together)."""
    n = (s.slots_asked() or 1)
    floor_ctx = min(layout.trained_ctx(s.ctx_len, n), max(_CTX_STEP * n, s.fit_ctx_floor * n))
    need = host_bytes(layout, s, floor_ctx)
    lacks = max(0, need - room) if room is not None else 0
    summary = f"does not fit: {why}" + (f" (lacks about {_gib(lacks)})" if lacks else "")
    return FitEstimate(verdict="none", summary=summary, gpu_layers=0, ctx_per_slot=0, gpu_bytes=0,
                       host_bytes=need, lacks_bytes=lacks, **common)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
