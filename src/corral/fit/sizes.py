"""The memory of one context by device, as llama.cpp sizes it (``Sizes``): weights, KV and
compute of each device holding layers, and what stays on the host. Shared by the fit plan
(``corral.fit.plan``) and the slot plan (``corral.fit.slots``). Neutral and pure, like them.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

from corral import wire
from corral.fit.layout import ModelLayout
from corral.fit.split import f32, layer_shares, split_weights
from corral.model.settings import ModelSettings

__all__ = ["Sizes", "has_side_context", "sizes_on_devices", "pad256"]


def has_side_context(s: ModelSettings) -> bool:
    """Whether a worker with these settings keeps room for the vision side context (a
    projector on a model that generates): one slot's KV and its compute buffers, created on
    the first image beside other streams and planned for from the start."""
    return bool(s.mmproj) and not s.embedding


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
class Sizes:
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
        seq = pad256(pad256(ctx // self.n_slots * self.n_slots) // self.n_slots)
        side = pad256(ctx // self.n_slots) if self.side else 0
        if lo.sliding_window > 0 and lo.swa_pattern > 1 and (layer + 1) % lo.swa_pattern != 0:
            seq = pad256(min(seq, lo.sliding_window + self.n_ubatch))
            side = pad256(min(side, lo.sliding_window + self.n_ubatch)) if side else 0
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


def sizes_on_devices(layout: ModelLayout, *, n_slots: int, n_ubatch: int, gpus: Sequence[wire.DeviceInfo],
                     tensor_split: Sequence[float] | None, cache_types: tuple[str, str], outputs: int,
                     side: bool) -> Sizes:
    """The sizes ``plan_fit`` plans with, for ``n_slots`` slots over ``gpus`` (split by
    ``tensor_split``, else by their free memory), for the slot plan (``corral.fit.slots``)."""
    weights = split_weights(len(gpus), tensor_split) if gpus else None
    return Sizes(layout, max(1, n_slots), max(1, n_ubatch),
                  layer_shares(weights or [d.free_bytes for d in gpus]) if gpus else (1.0,),
                  cache_types, outputs, side)


def pad256(n: int) -> int:
    return -(-n // 256) * 256
