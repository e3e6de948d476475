"""``n_gpu_layers = "auto"``: fit layers and context to a device's free memory.

Like llama.cpp's ``--fit``, in this order:

1. Everything on the device with the context asked for, if it fits in the device's free
   memory less a margin.
2. Else the context comes down (in whole slots of 256 cells) to the largest that fits,
   but not below the floor (``fit_ctx_floor`` per slot).
3. Else, at the floor, layers go to the host from the first one (llama.cpp offloads the
   last ``n_gpu_layers`` layers; the output head counts as one more) until the rest fits.
4. The host must hold what is left on it (weights, KV of host layers): when even that
   does not fit in the host's available memory, the load is refused with the numbers.

Memory per layer comes from the GGUF tensor table (``gguf_layout``); KV is f16, per cell
and layer ``2 * n_head_kv * (head_dim_k + head_dim_v)`` bytes (a sliding-window layer
holds at most ``n_swa + n_ubatch`` cells per slot); the compute buffer is an estimate
(logits and activations of one micro-batch) that the margin absorbs where it is short.
A pure function: tested with made-up devices and layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral import wire
from corral.worker.gguf_layout import ModelLayout

__all__ = ["FitError", "plan_fit", "DEFAULT_MARGIN_BYTES"]

DEFAULT_MARGIN_BYTES = 512 * 1024 * 1024
_CTX_STEP = 256


class FitError(Exception):
    """Even the floor does not fit: ``str(exc)`` says what was needed and what was free."""


@dataclass(frozen=True)
class _Sizes:
    layout: ModelLayout
    n_slots: int
    n_ubatch: int

    def kv_layer(self, layer: int, ctx: int) -> int:
        lo = self.layout
        cells = ctx
        if lo.sliding_window > 0 and lo.swa_pattern > 1 and (layer + 1) % lo.swa_pattern != 0:
            cells = min(ctx, (lo.sliding_window + self.n_ubatch) * self.n_slots)
        return lo.kv_bytes_per_cell() * cells

    def compute(self, ctx: int) -> int:
        lo = self.layout
        return 4 * self.n_ubatch * (lo.n_vocab + 16 * lo.n_embd) + 4 * self.n_ubatch * min(ctx, 4096)

    def on_device(self, ngl: int, ctx: int) -> int:
        lo = self.layout
        first = lo.n_layer - min(ngl, lo.n_layer)
        total = sum(lo.layer_bytes[first:]) + sum(self.kv_layer(i, ctx) for i in range(first, lo.n_layer))
        if ngl > lo.n_layer:
            total += lo.output_bytes
        return total + (self.compute(ctx) if ngl > 0 else 0)

    def on_host(self, ngl: int, ctx: int) -> int:
        lo = self.layout
        first = lo.n_layer - min(ngl, lo.n_layer)
        total = lo.input_bytes + sum(lo.layer_bytes[:first]) + sum(self.kv_layer(i, ctx) for i in range(first))
        if ngl <= lo.n_layer:
            total += lo.output_bytes
        return total


def plan_fit(layout: ModelLayout, *, device: wire.DeviceInfo, ctx_len: int, n_slots: int,
             ctx_floor_per_slot: int, n_ubatch: int = 512, margin_bytes: int = DEFAULT_MARGIN_BYTES,
             host_available_bytes: int | None = None) -> wire.FitPlan:
    """The largest placement on ``device`` (see the module docstring)."""
    s = _Sizes(layout, max(1, n_slots), max(1, n_ubatch))
    budget = device.free_bytes - margin_bytes
    full = layout.n_layer + 1
    step = _CTX_STEP * s.n_slots
    floor = min(ctx_len, max(step, ctx_floor_per_slot * s.n_slots))
    notes: list[str] = []
    ngl, ctx = full, ctx_len
    if s.on_device(full, ctx_len) > budget:
        ctx = (ctx_len // step) * step
        while ctx > floor and s.on_device(full, ctx) > budget:
            ctx -= step
        ctx = max(ctx, floor)
        if ctx < ctx_len:
            notes.append(f"context {ctx_len} -> {ctx} cells to fit {device.name}")
        if s.on_device(full, ctx) > budget:
            while ngl > 0 and s.on_device(ngl, ctx) > budget:
                ngl -= 1
            notes.append(f"{ngl} of {full} layers on {device.name}, the rest on the host")
    host = s.on_host(ngl, ctx)
    if host_available_bytes is not None and host > host_available_bytes:
        raise FitError(
            f"does not fit: {device.name} has {_mib(device.free_bytes)} free ({_mib(margin_bytes)} kept as margin) "
            f"and the host {_mib(host_available_bytes)} available; even with the context at its floor ({ctx} "
            f"cells) and {ngl} of {full} layers on the device, the host would need {_mib(host)}")
    return wire.FitPlan(n_gpu_layers=ngl, n_layers=full, ctx_len=ctx, ctx_len_asked=ctx_len,
                        device=device.name, device_bytes=s.on_device(ngl, ctx), host_bytes=host,
                        free_bytes=device.free_bytes, margin_bytes=margin_bytes,
                        notes="; ".join(notes) or "everything fits on the device")


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MiB"
