"""How llama.cpp splits a model's layers over several devices, reproduced (float32 as
there), and the weights corral gives it (``tensor_split``). Neutral: ``gpu_fit`` plans
with it, the router estimates and places with it, the worker passes its split on.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from corral.model.settings import ModelSettings

__all__ = ["f32", "layer_shares", "router_split", "split_by_weights", "split_weights"]


def f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def layer_shares(weights: Sequence[float]) -> tuple[float, ...]:
    """llama.cpp's split points for devices with these split weights (its
    ``tensor_split``, or without one their free bytes): the cumulative fractions, summed
    and divided in float32 as ``llama_model_base::load_tensors`` does."""
    acc, cum = 0.0, []
    for f in weights:
        acc = f32(acc + f32(float(max(0, f))))
        cum.append(acc)
    if acc <= 0:  # no device reports free memory: equal shares
        return tuple(f32((k + 1) / len(cum)) for k in range(len(cum)))
    return tuple(f32(c / acc) for c in cum)


def split_weights(n: int, tensor_split: Sequence[float] | None,
                  otherwise: Sequence[float] | None = None) -> list[float] | None:
    """The proportions to give llama.cpp for ``n`` devices, as float32 values: the
    ``tensor_split`` (padded with zeros, as llama-server pads ``-ts``), else ``otherwise``;
    None (one device, or nothing given): llama.cpp splits by free memory."""
    for given in (tensor_split, otherwise):
        if n >= 2 and given and any(x > 0 for x in given):
            head = [f32(max(0.0, float(x))) for x in given[:n]]
            return head + [0.0] * (n - len(head))
    return None


def router_split(settings: ModelSettings, budgets: Sequence[int], free: Sequence[int] | None = None
                 ) -> list[float] | None:
    """The split the router estimates an instance pinned to several GPUs with, and gives
    its worker as ``tensor_split``: the model's own, else for ``"auto"`` the GPUs' whole
    budgets, else (a fixed ``n_gpu_layers``) their free memory, as llama.cpp would."""
    fallback = budgets if settings.n_gpu_layers == "auto" or free is None else free
    return split_weights(len(budgets), settings.tensor_split, fallback)


def split_by_weights(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` bytes apportioned to devices in proportion to ``weights`` (their free
    memory, or a split; an estimate for a file whose layers are unknown)."""
    if len(weights) <= 1:
        return [total] * len(weights)
    whole = sum(max(0, w) for w in weights)
    out = [int(total * max(0, w) // whole) if whole else total // len(weights) for w in weights]
    out[-1] += total - sum(out)
    return out
