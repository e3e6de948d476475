"""``n_parallel = "auto"``: the slots planned from memory (``corral.fit.slots.plan_slots``)
on made-up layouts and devices; a real worker's load with it: ``tests/e2e/test_auto_slots.py``."""

from __future__ import annotations

import dataclasses

from corral import wire
from corral.fit.layout import ModelLayout
from corral.fit.plan import device_need, placement, plan_fit
from corral.fit.rows import outputs_max
from corral.fit.slots import HOST_SHARE, plan_slots, with_slots
from corral.model.settings import ModelSettings

MiB = 1024 * 1024
GiB = 1024 * MiB

# a 1.1B-like model: 22 layers of 40 MiB, 4 KV heads of 64 (22 KiB of f16 KV a cell, 704 MiB a
# slot of 32,768 cells), 1,130 MiB of weights, trained on 32k
LAYOUT = ModelLayout(architecture="llama", n_layer=22, n_embd=2048, n_head_kv=4, head_dim_k=64, head_dim_v=64,
                     n_vocab=32000, layer_bytes=(40 * MiB,) * 22, output_bytes=125 * MiB, input_bytes=125 * MiB,
                     n_ctx_train=32768)
SLOT = 22 * 32768 * 4 * (64 + 64) * 2  # one slot's KV at 32,768 cells
WEIGHTS = 22 * 40 * MiB + 250 * MiB


def gpu(free: int) -> wire.DeviceInfo:
    return wire.DeviceInfo(index=0, name="CUDA0", backend="CUDA", kind="gpu", free_bytes=free, total_bytes=free)


def host_bytes(layout: ModelLayout, s: ModelSettings, n: int) -> int:
    """Weights and KV on the host with ``n`` slots of ``s``'s context, as the worker places them."""
    parts = placement(layout, gpus=[], weights=None, ngl=0, ctx=n * s.slot_ctx(), n_slots=n, n_ubatch=512,
                      outputs=outputs_max(s, n))
    return sum(p.weight_bytes + p.kv_bytes for p in parts)


def test_a_number_set_is_kept_whatever_the_memory() -> None:
    s = ModelSettings(n_parallel=7, ctx_len=7 * 32768)
    plan = plan_slots(LAYOUT, s, host_available_bytes=1 * MiB)
    assert (plan.n_slots, plan.asked, plan.reason) == (7, "7", "n_parallel = 7 (set)")
    assert with_slots(s, plan) is s


def test_auto_on_the_host_takes_the_slots_half_the_available_memory_holds() -> None:
    s = ModelSettings()
    assert s.n_parallel == "auto" and s.slot_ctx() == 32768
    assert HOST_SHARE == 0.5
    available = 8 * GiB
    plan = plan_slots(LAYOUT, s, host_available_bytes=available)
    want = int((available * HOST_SHARE - WEIGHTS) // SLOT)  # (4096 - 1130) MiB / 704 MiB
    assert want == 4 and plan.n_slots == want and plan.where == "host" and plan.slot_bytes == SLOT
    assert host_bytes(LAYOUT, s, want) <= available * HOST_SHARE < host_bytes(LAYOUT, s, want + 1)
    assert "4 slots of 32768 cells (704 MiB each)" in plan.reason and "8192 MiB available" in plan.reason
    got = with_slots(s, plan)
    assert (got.n_parallel, got.ctx_len, got.slot_ctx()) == (4, 4 * 32768, 32768)


def test_a_smaller_slot_context_gives_more_slots_up_to_the_ceiling() -> None:
    small = ModelSettings(ctx_len=1024)  # with "auto", ctx_len is one slot's context
    plan = plan_slots(LAYOUT, small, host_available_bytes=16 * GiB)
    assert plan.n_slots == 64 and "the ceiling (n_parallel_max = 64)" in plan.reason
    capped = plan_slots(LAYOUT, ModelSettings(ctx_len=1024, n_parallel_max=8), host_available_bytes=16 * GiB)
    assert capped.n_slots == 8 and "n_parallel_max = 8" in capped.reason
    # a slot's context is capped at n_ctx_train before it is counted
    long = plan_slots(LAYOUT, ModelSettings(ctx_len=65536), host_available_bytes=8 * GiB)
    assert long.slot_ctx == 32768 and long.n_slots == 4


def test_too_little_memory_still_gives_one_slot_and_says_so() -> None:
    plan = plan_slots(LAYOUT, ModelSettings(), host_available_bytes=2 * GiB)
    assert plan.n_slots == 1 and plan.reason.startswith("1 slot: not even one slot of 32768 cells")
    unknown = plan_slots(LAYOUT, ModelSettings(), host_available_bytes=None)
    assert unknown.n_slots == 4 and "unknown" in unknown.reason
    unread = plan_slots(None, ModelSettings(), host_available_bytes=16 * GiB)
    assert unread.n_slots == 4 and "could not be read" in unread.reason


def test_sliding_window_layers_count_only_their_window() -> None:
    """Gemma-like: 5 of every 6 layers keep n_swa + n_ubatch cells a slot, so a slot costs far
    less than 32,768 cells in every layer, and the count follows."""
    swa = dataclasses.replace(LAYOUT, sliding_window=512, swa_pattern=6, n_layer=24,
                              layer_bytes=(40 * MiB,) * 24)
    plan = plan_slots(swa, ModelSettings(), host_available_bytes=4 * GiB)
    per_cell = 4 * (64 + 64) * 2
    assert plan.slot_bytes == 4 * 32768 * per_cell + 20 * 1024 * per_cell  # 4 full layers, 20 windows
    assert plan.n_slots < 64  # below the ceiling: the memory decided
    assert host_bytes(swa, ModelSettings(), plan.n_slots) <= 4 * GiB * HOST_SHARE
    assert host_bytes(swa, ModelSettings(), plan.n_slots + 1) > 4 * GiB * HOST_SHARE


def test_auto_on_a_gpu_keeps_every_layer_and_the_whole_context() -> None:
    """The slots that fit the GPU whole: plan_fit then keeps the context and every layer;
    one more slot would have lowered the context."""
    margin = 512 * MiB
    s = ModelSettings()
    plan = plan_slots(LAYOUT, s, gpus=[gpu(8 * GiB)], margin_bytes=margin)
    n = plan.n_slots
    assert 1 < n < 64 and plan.where == "CUDA0"

    def fit(k: int) -> wire.FitPlan:
        return plan_fit(LAYOUT, device=gpu(8 * GiB), ctx_len=k * 32768, n_slots=k, ctx_floor_per_slot=1024,
                        margin_bytes=margin, outputs=outputs_max(s, k))

    assert fit(n).ctx_len == n * 32768 and fit(n).n_gpu_layers == LAYOUT.n_layer + 1
    assert fit(n + 1).ctx_len < (n + 1) * 32768
    # the router's share of the GPU bounds it too
    shared = plan_slots(LAYOUT, s, gpus=[gpu(8 * GiB)], limits=[3 * GiB], margin_bytes=margin)
    assert shared.n_slots < n


def test_the_router_estimates_the_need_of_the_slots_the_worker_will_plan() -> None:
    """device_need with "auto" is the need of the resolved count, on the same budget."""
    budget = 8 * GiB
    plan = plan_slots(LAYOUT, ModelSettings(), gpus=[gpu(budget)], limits=[budget])
    resolved = with_slots(ModelSettings(), plan)
    assert device_need(LAYOUT, ModelSettings(), budget_bytes=budget) == device_need(LAYOUT, resolved,
                                                                                    budget_bytes=budget)
    assert device_need(LAYOUT, ModelSettings(), budget_bytes=budget) <= budget
