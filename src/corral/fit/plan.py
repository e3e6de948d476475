"""GPU memory of a model, by layer, and ``n_gpu_layers = "auto"``'s fit plan.

Neutral (imports only ``wire``, ``settings`` and its own ``fit`` modules): the worker plans its load with it
(``plan_fit``), the router estimates an instance's device memory before it starts
(``device_need``) with the same math, for placement and the per-device budget.

``plan_fit`` works like llama.cpp's ``--fit``, in this order, each slot first capped at ``n_ctx_train``:

1. Everything on the device(s) with the context asked for, if it fits in each device's
   free memory less a margin. With several devices (a worker pinned to several GPUs) the
   offloaded layers are split over them as llama.cpp's ``load_tensors`` does with split
   mode "layer": each device's share of the layers is its share of the split weights, in
   order, the last offloaded unit (the output head when offloaded) on the last device that
   gets any; each layer's KV goes with the layer. The weights are the worker's
   ``tensor_split`` when set (the model's own, or the one the router estimated with:
   ``router_split``), else llama.cpp's own: the devices' free memory. The worker passes
   the weights it planned with to llama.cpp (``FitPlan.tensor_split``), so what the
   router charged each GPU is where the layers go.
2. Else the context comes down (in whole slots of 256 cells) to the largest that fits,
   but not below the floor (``fit_ctx_floor`` per slot).
3. Else, at the floor, layers go to the host from the first one until the rest fits. As in
   the llama.cpp vendored (``i_gpu_start = n_layer + 1 - n_gpu_layers``), ``n_gpu_layers
   = k`` offloads the output head and the last ``k - 1`` repeating layers; the head of a
   model with tied embeddings (no ``output.weight``, e.g. Gemma) is a copy of the token
   embeddings on that device, and is counted so.
4. The host must hold what is left on it (weights, KV of host layers): when even that
   does not fit in the host's available memory, the load is refused with the numbers.

Memory per layer comes from the GGUF tensor table (``read_layout``, corral.fit.layout); KV per cell and layer
is ``n_head_kv * (head_dim_k + head_dim_v)`` elements of the cache types (f16: 2 bytes) (a sliding-window layer
holds at most ``n_swa + n_ubatch`` cells per slot); the compute buffer is an estimate
(the logits rows the context asks for, ``fit.rows.outputs_max``, and activations of one
micro-batch) that the margin absorbs where it is short; a model with a vision projector
keeps room for its side context as well (one more slot's KV, its own compute buffer). With
several devices, the one holding the last offloaded unit gets all of it, each other device
holding layers the activations (llama.cpp gives every device its own compute buffer).
Pure functions: tested with made-up devices and layouts.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from corral import wire
from corral.fit.layout import ModelLayout
from corral.fit.rows import outputs_max
from corral.fit.split import f32, layer_shares, router_split, split_weights
from corral.model.settings import ModelSettings

__all__ = ["FitError", "plan_fit", "device_need", "device_needs", "placement", "DEFAULT_MARGIN_BYTES",
           "has_side_context"]

DEFAULT_MARGIN_BYTES = 512 * 1024 * 1024
_CTX_STEP = 256


def has_side_context(s: ModelSettings) -> bool:
    """Whether a worker with these settings keeps room for the vision side context (a
    projector on a model that generates): one slot's KV and its compute buffers, created on
    the first image beside other streams and planned for from the start."""
    return bool(s.mmproj) and not s.embedding


class FitError(Exception):
    """Even the floor does not fit: ``str(exc)`` says what was needed and what was free."""


@dataclasses.dataclass
class _Share:
    """One device's part: its repeating layers (``first`` and on), the output head or not."""

    first: int = -1
    layers: int = 0
    output: bool = False
    weights: int = 0
    kv: int = 0
    compute: int = 0


@dataclasses.dataclass(frozen=True)
class _Sizes:
    layout: ModelLayout
    n_slots: int
    n_ubatch: int
    shares: tuple[float, ...] = (1.0,)  # each device's cumulative share of the GPU layers (llama.cpp's splits)
    cache_types: tuple[str, str] = ("f16", "f16")  # K and V
    outputs: int = 0  # the context's logits rows (fit.rows.outputs_max; 0: a whole micro-batch, llama.cpp's default)
    side: bool = False  # a vision projector: the side context for images beside streams (worker/media/side.py)

    def kv_layer(self, layer: int, ctx: int) -> int:
        """KV bytes of one layer with ``ctx`` cells asked for in all, sized as llama.cpp
        sizes a cache of one stream per slot (``llama_context``, ``llama_kv_cache_iswa``):
        each slot's share padded to 256 cells; a sliding-window layer's to at most
        ``n_swa + n_ubatch``, padded to 256 too. With ``side``, one more slot's cells: the
        side context's one sequence (``n_ctx`` one slot's share, padded the same way)."""
        lo = self.layout
        seq = _pad256(_pad256(ctx // self.n_slots * self.n_slots) // self.n_slots)
        side = _pad256(ctx // self.n_slots) if self.side else 0
        if lo.sliding_window > 0 and lo.swa_pattern > 1 and (layer + 1) % lo.swa_pattern != 0:
            seq = _pad256(min(seq, lo.sliding_window + self.n_ubatch))
            side = _pad256(min(side, lo.sliding_window + self.n_ubatch)) if side else 0
        return lo.kv_bytes_per_cell(*self.cache_types) * (seq * self.n_slots + side)

    def logits(self) -> int:
        """The main context's logits rows in its compute buffer (``n_outputs_max`` of them, at
        most a micro-batch)."""
        rows = min(self.n_ubatch, self.outputs) if self.outputs > 0 else self.n_ubatch
        return 4 * rows * self.layout.n_vocab

    def compute(self, ctx: int) -> int:
        """The compute buffers of the device holding the last offloaded unit: the main
        context's (its logits and one micro-batch's activations) and, with ``side``, the side
        context's (activations over one slot's cells, one row of logits)."""
        return self.logits() + self._activations(ctx) + (
            self._activations(ctx // self.n_slots) + 4 * self.layout.n_vocab if self.side else 0)

    def _activations(self, ctx: int) -> int:
        return 4 * self.n_ubatch * 16 * self.layout.n_embd + 4 * self.n_ubatch * min(ctx, 4096)

    def detail(self, ngl: int, ctx: int) -> list[_Share]:
        """What each device holds with ``ngl`` layers offloaded, split as llama.cpp's
        ``load_tensors`` does (split mode "layer"): GPU layer ``u`` of ``act`` (the output
        head last) goes to the first device whose cumulative share of the split weights
        exceeds ``u / act`` (float32, as there); each layer's KV goes with it;
        the device of the last GPU layer gets the whole compute estimate, the others its
        activation part (no logits)."""
        lo = self.layout
        out = [_Share() for _ in self.shares]
        act = min(max(ngl, 0), lo.n_layer + 1)
        if act == 0:
            return out
        # the offloaded units in llama.cpp's order (``i_gpu_start = n_layer + 1 - ngl``):
        # the last ``act - 1`` repeating layers, then the output head
        units = list(range(lo.n_layer + 1 - act, lo.n_layer)) + [lo.n_layer]
        dev = 0
        for u, il in enumerate(units):
            dev = min(bisect.bisect_right(self.shares, f32(f32(u) / act)), len(out) - 1)
            d = out[dev]
            if il == lo.n_layer:
                d.output, d.weights = True, d.weights + lo.head_bytes
            else:
                d.first = il if d.layers == 0 else d.first
                d.layers, d.weights, d.kv = d.layers + 1, d.weights + lo.layer_bytes[il], d.kv + self.kv_layer(il, ctx)
        for k, d in enumerate(out):
            if k == dev:
                d.compute = self.compute(ctx)
            elif d.weights > 0:
                d.compute = self.compute(ctx) - self.logits() - (4 * lo.n_vocab if self.side else 0)
        return out

    def per_device(self, ngl: int, ctx: int) -> list[int]:
        """Bytes on each device with ``ngl`` layers offloaded (``detail``)."""
        return [d.weights + d.kv + d.compute for d in self.detail(ngl, ctx)]

    def on_device(self, ngl: int, ctx: int) -> int:
        return sum(self.per_device(ngl, ctx))

    def on_host(self, ngl: int, ctx: int) -> int:
        _, weights, kv = self.host_parts(ngl, ctx)
        return weights + kv

    def host_parts(self, ngl: int, ctx: int) -> tuple[int, int, int]:
        """(repeating layers kept on the host, their weights with the input layer and, with
        nothing offloaded, the output head, their KV)."""
        lo = self.layout
        act = min(max(ngl, 0), lo.n_layer + 1)
        first = lo.n_layer - max(0, act - 1)  # the repeating layers before the offloaded ones
        weights = lo.input_bytes + sum(lo.layer_bytes[:first]) + (lo.output_bytes if act == 0 else 0)
        return first, weights, sum(self.kv_layer(i, ctx) for i in range(first))


def _pad256(n: int) -> int:
    return -(-n // 256) * 256


def plan_fit(layout: ModelLayout, *, device: wire.DeviceInfo | None = None,
             devices: Sequence[wire.DeviceInfo] = (), limits: Sequence[int | None] = (), ctx_len: int,
             n_slots: int, ctx_floor_per_slot: int, n_ubatch: int = 512, margin_bytes: int = DEFAULT_MARGIN_BYTES,
             host_available_bytes: int | None = None, tensor_split: Sequence[float] | None = None,
             cache_types: tuple[str, str] = ("f16", "f16"), outputs: int = 0, side: bool = False) -> wire.FitPlan:
    """The largest placement on ``device`` or on ``devices`` (see the module docstring).

    With several devices the GPU layers are apportioned to them by ``tensor_split`` (else
    by their free memory, as llama.cpp does by itself), and every device must hold its
    share within its free memory less the margin (a device that gets nothing is not
    asked to). ``limits[k]``: at most this much of
    device ``k`` (the router's share; None: its free memory less the margin). ``outputs``:
    the context's logits rows (``fit.rows.outputs_max``; 0: a micro-batch); ``side``: room
    for the vision side context too (``_Sizes``)."""
    devs = list(devices) if devices else ([device] if device is not None else [])
    if not devs:
        raise ValueError("plan_fit needs a device")
    lims = list(limits) + [None] * (len(devs) - len(limits))
    free = [d.free_bytes if lim is None else min(d.free_bytes, lim + margin_bytes) for d, lim in zip(devs, lims)]
    caps = [f - margin_bytes for f in free]
    weights = split_weights(len(devs), tensor_split)
    s = _Sizes(layout, max(1, n_slots), max(1, n_ubatch), layer_shares(weights or [d.free_bytes for d in devs]),
               cache_types, outputs, side)
    names = ",".join(d.name for d in devs)
    want = layout.trained_ctx(ctx_len, s.n_slots)  # ctx_len_asked stays what was asked

    def fits(ngl: int, ctx: int) -> bool:
        return all(b == 0 or b <= c for b, c in zip(s.per_device(ngl, ctx), caps))

    full = layout.n_layer + 1
    step = _CTX_STEP * s.n_slots
    floor = min(want, max(step, ctx_floor_per_slot * s.n_slots))
    notes: list[str] = []
    ngl, ctx = full, want
    if not fits(full, want):
        ctx = (want // step) * step
        while ctx > floor and not fits(full, ctx):
            ctx -= step
        ctx = max(ctx, floor)
        if ctx < want:
            notes.append(f"context {want} -> {ctx} cells to fit {names}")
        if not fits(full, ctx):
            while ngl > 0 and not fits(ngl, ctx):
                ngl -= 1
            notes.append(f"{ngl} of {full} layers on {names}, the rest on the host")
    host = s.on_host(ngl, ctx)
    if host_available_bytes is not None and host > host_available_bytes:
        has = " and ".join(f"{d.name} has {_mib(f)} free" for d, f in zip(devs, free))
        raise FitError(
            f"does not fit: {has} ({_mib(margin_bytes)} kept as margin) "
            f"and the host {_mib(host_available_bytes)} available; even with the context at its floor ({ctx} "
            f"cells) and {ngl} of {full} layers on the device, the host would need {_mib(host)}")
    split = s.per_device(ngl, ctx)
    return wire.FitPlan(n_gpu_layers=ngl, n_layers=full, ctx_len=ctx, ctx_len_asked=ctx_len,
                        device=names, device_bytes=sum(split), host_bytes=host,
                        free_bytes=sum(free), margin_bytes=margin_bytes,
                        notes="; ".join(notes) or "everything fits on the device",
                        devices=[wire.DevicePlan(index=k, name=d.name, bytes=b, free_bytes=f)
                                 for k, (d, b, f) in enumerate(zip(devs, split, free))] if len(devs) > 1 else [],
                        tensor_split=weights or [])


def device_needs(layout: ModelLayout, settings: ModelSettings, *, budgets: Sequence[int],
                 free: Sequence[int] | None = None) -> list[int]:
    """What one instance with ``settings`` would take on each of the devices whose whole
    budgets are ``budgets`` (the router's estimate before a start; ``free``: the devices'
    free memory; default: the budgets). The layers are split by ``router_split``, which
    the worker is given as its ``tensor_split``.
    ``"auto"`` plans as the worker would on those devices when empty (no need exceeds its
    budget; the context and layers come down first); a number of layers takes what it takes."""
    n_ubatch = min(settings.n_batch, 512)
    ngl = settings.n_gpu_layers
    layout = layout.kv_sized(settings.swa_full)
    shares = list(budgets if free is None else free)
    weights = router_split(settings, budgets, free)
    kv_types = (settings.cache_type_k, settings.cache_type_v)
    outputs, side = outputs_max(settings, max(1, settings.n_parallel)), has_side_context(settings)
    if ngl == "auto":
        devs = [wire.DeviceInfo(index=k, name=f"GPU{k}", backend="GPU", kind="gpu", free_bytes=max(0, f),
                                total_bytes=max(0, f)) for k, f in enumerate(shares)]
        plan = plan_fit(layout, devices=devs, limits=[max(0, b) for b in budgets], ctx_len=settings.ctx_len,
                        n_slots=settings.n_parallel, ctx_floor_per_slot=settings.fit_ctx_floor,
                        n_ubatch=n_ubatch, margin_bytes=0, tensor_split=weights, cache_types=kv_types,
                        outputs=outputs, side=side)
        return [d.bytes for d in plan.devices] or [plan.device_bytes]
    s = _Sizes(layout, max(1, settings.n_parallel), max(1, n_ubatch), layer_shares(weights or shares), kv_types,
               outputs, side)
    return s.per_device(layout.n_layer + 1 if ngl < 0 else ngl, settings.ctx_len)


def device_need(layout: ModelLayout, settings: ModelSettings, *, budget_bytes: int) -> int:
    """``device_needs`` on one device whose whole budget is ``budget_bytes``."""
    return device_needs(layout, settings, budgets=[budget_bytes])[0]


def placement(layout: ModelLayout, *, gpus: Sequence[wire.DeviceInfo], weights: Sequence[float] | None,
              ngl: int, ctx: int, n_slots: int, n_ubatch: int, cache_types: tuple[str, str] = ("f16", "f16"),
              outputs: int = 0, side: bool = False) -> list[wire.DevicePlacement]:
    """Where a loaded model's parts are, by llama.cpp's rules: each GPU that holds any
    (split by ``weights``, else by the GPUs' free memory), then the host ("CPU"). ``ngl``
    as given to llama.cpp (negative: all). With ``side`` the room kept for the vision side
    context is counted with the layers' KV and the compute, as ``plan_fit`` planned it."""
    lo = layout
    act = 0 if not gpus else lo.n_layer + 1 if ngl < 0 else min(ngl, lo.n_layer + 1)
    s = _Sizes(lo, max(1, n_slots), max(1, n_ubatch), layer_shares(weights or [d.free_bytes for d in gpus]),
               cache_types, outputs, side)
    out = [wire.DevicePlacement(device=g.name, first_layer=d.first, layers=d.layers, output=d.output,
                                weight_bytes=d.weights, kv_bytes=d.kv, compute_bytes=d.compute)
           for g, d in zip(gpus, s.detail(act, ctx)) if d.weights > 0]
    first, host_weights, kv = s.host_parts(act, ctx)
    out.append(wire.DevicePlacement(device="CPU", first_layer=0 if first else -1, layers=first, output=act == 0,
                                    weight_bytes=host_weights, input_bytes=lo.input_bytes, kv_bytes=kv,
                                    compute_bytes=0))
    return out


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MiB"
