"""GPU memory of a model, by layer, and ``n_gpu_layers = "auto"``'s fit plan.

Neutral (imports only ``wire`` and ``gguf_header``): the worker plans its load with it
(``plan_fit``), the router estimates an instance's device memory before it starts
(``device_need``) with the same math, for placement and the per-device budget.

``plan_fit`` works like llama.cpp's ``--fit``, in this order:

1. Everything on the device with the context asked for, if it fits in the device's free
   memory less a margin.
2. Else the context comes down (in whole slots of 256 cells) to the largest that fits,
   but not below the floor (``fit_ctx_floor`` per slot).
3. Else, at the floor, layers go to the host from the first one (llama.cpp offloads the
   last ``n_gpu_layers`` layers; the output head counts as one more) until the rest fits.
4. The host must hold what is left on it (weights, KV of host layers): when even that
   does not fit in the host's available memory, the load is refused with the numbers.

Memory per layer comes from the GGUF tensor table (``read_layout``); KV is f16, per cell
and layer ``2 * n_head_kv * (head_dim_k + head_dim_v)`` bytes (a sliding-window layer
holds at most ``n_swa + n_ubatch`` cells per slot); the compute buffer is an estimate
(logits and activations of one micro-batch) that the margin absorbs where it is short.
Pure functions: tested with made-up devices and layouts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from corral import wire
from corral.gguf_header import GGUFError, array_len, read_header
from corral.settings import ModelSettings

__all__ = ["ModelLayout", "read_layout", "FitError", "plan_fit", "device_need", "DEFAULT_MARGIN_BYTES",
           "GGUFError"]

DEFAULT_MARGIN_BYTES = 512 * 1024 * 1024
_CTX_STEP = 256
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelLayout:
    architecture: str
    n_layer: int
    n_embd: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    layer_bytes: tuple[int, ...]  # weights of each repeating layer (blk.N.*)
    output_bytes: int  # the output head and final norm (offloaded with n_gpu_layers = n_layer + 1)
    input_bytes: int  # token embeddings and the rest (llama.cpp keeps the input layer on the host)
    sliding_window: int = 0  # 0: every layer attends over the whole context
    swa_pattern: int = 0  # every swa_pattern-th layer is a full-attention layer

    @property
    def weight_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes + self.input_bytes

    def kv_bytes_per_cell(self) -> int:
        """K and V of one cell in one layer, f16."""
        return 2 * self.n_head_kv * (self.head_dim_k + self.head_dim_v)


def read_layout(path: str | Path) -> ModelLayout:
    """The layout of a GGUF file (``GGUFError`` when it has no ``ARCH.block_count``)."""
    header = read_header(path)
    meta = header.values
    arch = str(meta.get("general.architecture", ""))

    def num(key: str, default: int = 0) -> int:
        v = meta.get(f"{arch}.{key}", default)
        if isinstance(v, list):  # per-layer arrays: take the largest
            v = max((x for x in v if isinstance(x, int)), default=default)
        return int(v) if isinstance(v, (int, float)) else default

    n_layer = num("block_count")
    if n_layer <= 0:
        raise GGUFError(f"no {arch}.block_count in {path}")
    n_embd = num("embedding_length")
    n_head = num("attention.head_count", 1)
    n_head_kv = num("attention.head_count_kv", n_head)
    head_k = num("attention.key_length", n_embd // max(1, n_head))
    head_v = num("attention.value_length", head_k)
    layers = [0] * n_layer
    output = inputs = 0
    for name, nbytes in header.tensor_bytes().items():
        m = _LAYER.match(name)
        if m and int(m.group(1)) < n_layer:
            layers[int(m.group(1))] += nbytes
        elif name.startswith("output"):
            output += nbytes
        else:
            inputs += nbytes
    n_vocab = array_len(meta.get("tokenizer.ggml.tokens")) or num("vocab_size")
    pattern = num("attention.sliding_window_pattern", 6 if arch.startswith("gemma3") else 0)
    return ModelLayout(architecture=arch, n_layer=n_layer, n_embd=n_embd, n_head_kv=n_head_kv,
                       head_dim_k=head_k, head_dim_v=head_v, n_vocab=n_vocab,
                       layer_bytes=tuple(layers), output_bytes=output, input_bytes=inputs,
                       sliding_window=num("attention.sliding_window"), swa_pattern=pattern)


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


def device_need(layout: ModelLayout, settings: ModelSettings, *, budget_bytes: int) -> int:
    """What one instance with ``settings`` would take on a device whose whole budget is
    ``budget_bytes`` (the router's estimate before a start): ``"auto"`` plans as the
    worker would on that device when empty (the need never exceeds the budget; the
    context and layers come down first); a number of layers takes what it takes."""
    n_ubatch = min(settings.n_batch, 512)
    ngl = settings.n_gpu_layers
    if ngl == "auto":
        dev = wire.DeviceInfo(index=0, name="GPU", backend="GPU", kind="gpu", free_bytes=max(0, budget_bytes),
                              total_bytes=max(0, budget_bytes))
        return plan_fit(layout, device=dev, ctx_len=settings.ctx_len, n_slots=settings.n_parallel,
                        ctx_floor_per_slot=settings.fit_ctx_floor, n_ubatch=n_ubatch, margin_bytes=0).device_bytes
    s = _Sizes(layout, max(1, settings.n_parallel), max(1, n_ubatch))
    return s.on_device(layout.n_layer + 1 if ngl < 0 else ngl, settings.ctx_len)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MiB"
