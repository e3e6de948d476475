"""``n_parallel = "auto"``: how many slots a model gets (``plan_slots``).

A slot is a sequence decoded beside the others, with its whole context reserved (one KV
stream a slot, as llama-server's default; docs/internals/worker-engine.md, "Slots sized
from memory"). With ``"auto"`` the count comes from the memory the plan leaves after the
weights, in whole slots of the context one slot asks for (``ModelSettings.slot_ctx``:
``ctx_len``, else ``DEFAULT_SLOT_CTX``, capped at the model's ``n_ctx_train``), within
``n_parallel_max``:

- On the GPU(s) (``n_gpu_layers`` not 0 and a GPU seen): the most slots whose plan with
  every layer offloaded fits each GPU's free memory (or the router's share of it) less
  the margin, by the same sizes as ``plan_fit`` (weights, KV, compute, the vision side
  context). At least one: a model that does not fit whole goes on to ``plan_fit``, which
  lowers its context and then its layers.
- On the host: the most slots whose weights and KV take at most ``HOST_SHARE`` of the
  host's available memory (``MemAvailable``): the half a fixed count's context is fitted
  within too (``worker/fit.py``). The KV a slot reserves is touched at the load: 64 slots
  of 32,768 cells of Gemma 3 270M hold 7 GiB of RAM whether or not anyone uses them. A
  quarter (session 17) gave the embedded model 42 slots on a 24 GB box and left 22 of 64
  clients a whole generation behind (TTFT p95 3.0x better than 4 slots, where the goal
  was 5x; docs/benchmarks/2026-12-06-slots-and-router-ceiling.md); a half gives it the 64.

A number set (``n_parallel = N``) is kept as it is. Pure functions of a layout, settings
and the memory seen: the worker plans its load with them, the router estimates a GPU's
need with them before the worker reports (``fit.plan.device_needs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec

from corral import wire
from corral.fit.layout import ModelLayout
from corral.fit.sizes import has_side_context, sizes_on_devices
from corral.fit.rows import outputs_max
from corral.model.settings import ModelSettings

__all__ = ["plan_slots", "with_slots", "HOST_SHARE", "UNREAD_SLOTS"]

_S = TypeVar("_S", bound=ModelSettings)

HOST_SHARE = 0.5  # of MemAvailable: what weights and the slots' KV may take on the host
UNREAD_SLOTS = 4  # "auto" where the GGUF's layout cannot be read (llama.cpp may still load it)


def plan_slots(layout: ModelLayout | None, s: ModelSettings, *, gpus: Sequence[wire.DeviceInfo] = (),
               limits: Sequence[int | None] = (), margin_bytes: int = 0,
               tensor_split: Sequence[float] | None = None,
               host_available_bytes: int | None = None) -> wire.SlotPlan:
    """The slots of a model with settings ``s`` (see the module docstring). ``gpus``: the
    GPUs it will be offloaded to (empty: it runs on the host), ``limits[k]`` the most of GPU
    ``k`` it may take (None: its free memory), less ``margin_bytes`` each; ``layout``: as
    its KV cache is sized (``kv_sized``), None where unreadable."""
    asked = s.slots_asked()
    ctx = s.slot_ctx() if layout is None else layout.trained_ctx(s.slot_ctx(), 1)
    if asked is not None:
        return wire.SlotPlan(n_slots=asked, asked=str(asked), slot_ctx=ctx, slot_bytes=0, budget_bytes=0,
                             where="", reason=f"n_parallel = {asked} (set)")
    top = s.n_parallel_max
    if layout is None:
        n = min(UNREAD_SLOTS, top)
        return wire.SlotPlan(n_slots=n, asked="auto", slot_ctx=ctx, slot_bytes=0, budget_bytes=0, where="",
                             reason=f"{n} slots: the GGUF's layout could not be read to size them")
    n_ubatch = max(1, min(s.n_batch, 512))
    kv_types = (s.cache_type_k, s.cache_type_v)
    side = has_side_context(s)

    def need(n: int) -> list[int]:
        """Bytes on each GPU (or, with none, on the host) with ``n`` slots of ``ctx``."""
        sizes = sizes_on_devices(layout, n_slots=n, n_ubatch=n_ubatch, gpus=gpus, tensor_split=tensor_split,
                                 cache_types=kv_types, outputs=outputs_max(s, n), side=side)
        if gpus:
            return sizes.per_device(layout.n_layer + 1, n * ctx)
        return [sizes.on_host(0, n * ctx)]

    if gpus:
        lims = list(limits) + [None] * (len(gpus) - len(limits))
        caps = [(g.free_bytes if lim is None else min(g.free_bytes, lim + margin_bytes)) - margin_bytes
                for g, lim in zip(gpus, lims)]
        where = ",".join(g.name for g in gpus)
    elif host_available_bytes is not None:
        caps, where = [int(host_available_bytes * HOST_SHARE)], "host"
    else:
        n = min(UNREAD_SLOTS, top)
        return wire.SlotPlan(n_slots=n, asked="auto", slot_ctx=ctx, slot_bytes=0, budget_bytes=0, where="host",
                             reason=f"{n} slots: the host's available memory is unknown")

    def fits(n: int) -> bool:
        return all(b == 0 or b <= c for b, c in zip(need(n), caps))

    one = sum(need(2)) - sum(need(1))  # one more slot: its KV (and a logits row)
    fixed = sum(need(1)) - one  # the weights and compute
    budget = max(0, sum(caps) - fixed)
    lo, hi = 1, top  # the most that fits: fits() is monotonic in n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    n = lo
    room = f"{_mib(budget)} left after the weights on {where}" + (
        f" ({HOST_SHARE:.0%} of the host's {_mib(host_available_bytes)} available)"
        if not gpus and host_available_bytes is not None else "")
    if n == top and fits(top):
        reason = f"{n} slots, the ceiling (n_parallel_max = {top}); {room}, {_mib(one)} a slot of {ctx} cells"
    elif n == 1 and not fits(1):
        reason = f"1 slot: not even one slot of {ctx} cells ({_mib(one)}) fits in {room}"
    else:
        reason = f"{n} slots of {ctx} cells ({_mib(one)} each) fit in {room}"
    return wire.SlotPlan(n_slots=n, asked="auto", slot_ctx=ctx, slot_bytes=one, budget_bytes=budget, where=where,
                         reason=reason)


def with_slots(s: _S, plan: wire.SlotPlan) -> _S:
    """``s`` with ``"auto"`` resolved to the plan's slots, ``ctx_len`` their total (a number
    set comes back as it was). Any subclass of ``ModelSettings`` keeps its type."""
    if s.slots_asked() is not None:
        return s
    return msgspec.structs.replace(s, n_parallel=plan.n_slots, ctx_len=plan.n_slots * s.slot_ctx())


def _mib(n: int | None) -> str:
    return f"{(n or 0) / (1024 * 1024):.0f} MiB"
