"""The fit estimate before a download or a load (corral.fit.estimate), on made-up devices:
each verdict is what ``plan_fit`` (and, with no GPU, the worker's host sizing) decides."""

from __future__ import annotations

from corral import wire
from corral.fit.estimate import GpuBudget, estimate
from corral.fit.layout import ModelLayout
from corral.fit.plan import plan_fit
from corral.fit.rows import outputs_max
from corral.model.settings import ModelSettings

MiB = 1024 * 1024
GiB = 1024 * MiB

# a 1.1B-like model: 22 layers of 40 MiB, 125 MiB output head, 125 MiB embeddings (tests/worker/fit/test_fit.py's)
LAYOUT = ModelLayout(architecture="llama", n_layer=22, n_embd=2048, n_head_kv=4, head_dim_k=64, head_dim_v=64,
                     n_vocab=32000, layer_bytes=(40 * MiB,) * 22, output_bytes=125 * MiB, input_bytes=125 * MiB,
                     n_ctx_train=8192)
S = ModelSettings(ctx_len=4 * 8192, n_parallel=4)


def _plan(budgets: list[int], host: int | None = None) -> wire.FitPlan:
    devs = [wire.DeviceInfo(index=k, name=f"CUDA{k}", backend="GPU", kind="gpu", free_bytes=b, total_bytes=b)
            for k, b in enumerate(budgets)]
    return plan_fit(LAYOUT, devices=devs, ctx_len=S.ctx_len, n_slots=4, ctx_floor_per_slot=S.fit_ctx_floor,
                    margin_bytes=0, host_available_bytes=host, outputs=outputs_max(S, 4),
                    tensor_split=[float(b) for b in budgets] if len(budgets) > 1 else None)


def test_everything_on_a_big_gpu() -> None:
    e = estimate(LAYOUT, S, gpus=[GpuBudget("CUDA0", 70 * GiB)], host_available_bytes=64 * GiB)
    assert (e.verdict, e.gpu_layers, e.n_layers, e.ctx_per_slot, e.ctx_per_slot_asked) == ("gpu", 23, 23, 8192, 8192)
    assert e.gpu_bytes == _plan([70 * GiB]).device_bytes
    assert "all 23 layers on CUDA0" in e.summary and "8192 tokens of context a slot" in e.summary


def test_a_smaller_gpu_brings_the_context_down_then_offloads_part() -> None:
    e = estimate(LAYOUT, S, gpus=[GpuBudget("CUDA0", 1200 * MiB)], host_available_bytes=64 * GiB)
    p = _plan([1200 * MiB])
    assert e.verdict == "gpu" and e.ctx_per_slot == p.ctx_len // 4 < 8192
    e = estimate(LAYOUT, S, gpus=[GpuBudget("CUDA0", 600 * MiB)], host_available_bytes=64 * GiB)
    p = _plan([600 * MiB])
    assert e.verdict == "partial" and 0 < e.gpu_layers == p.n_gpu_layers < 23
    assert e.host_bytes == p.host_bytes and f"{p.n_gpu_layers} of 23 layers" in e.summary


def test_two_gpus_together() -> None:
    e = estimate(LAYOUT, S, gpus=[GpuBudget("CUDA0", 500 * MiB), GpuBudget("CUDA1", 700 * MiB)],
                 host_available_bytes=64 * GiB)
    p = _plan([500 * MiB, 700 * MiB])
    assert (e.verdict, e.gpu_layers, e.gpu_bytes) == ("gpu" if p.n_gpu_layers == 23 else "partial", p.n_gpu_layers,
                                                      p.device_bytes)


def test_no_gpu_host_ram_only_with_the_workers_context() -> None:
    e = estimate(LAYOUT, S, gpus=[], host_available_bytes=64 * GiB)
    assert (e.verdict, e.gpu_layers, e.ctx_per_slot) == ("host", 0, 8192)
    # little RAM: the worker keeps weights and KV within half of it, down to the floor
    small = estimate(LAYOUT, S, gpus=[], host_available_bytes=3 * GiB)
    assert small.verdict == "host" and S.fit_ctx_floor <= small.ctx_per_slot < 8192
    assert small.host_bytes <= 3 * GiB // 2
    # n_gpu_layers = 0 on a machine with a GPU: the host too
    assert estimate(LAYOUT, ModelSettings(ctx_len=S.ctx_len, n_parallel=4, n_gpu_layers=0),
                    gpus=[GpuBudget("CUDA0", 70 * GiB)], host_available_bytes=64 * GiB).verdict == "host"


def test_does_not_fit_says_what_it_lacks() -> None:
    e = estimate(LAYOUT, S, gpus=[], host_available_bytes=500 * MiB)
    assert e.verdict == "none" and e.lacks_bytes == e.host_bytes - 500 * MiB > 0
    assert "does not fit" in e.summary and "lacks" in e.summary
    g = estimate(LAYOUT, S, gpus=[GpuBudget("CUDA0", 200 * MiB)], host_available_bytes=300 * MiB)
    assert g.verdict == "none" and g.lacks_bytes > 0


def test_a_fixed_layer_count_takes_what_it_takes() -> None:
    s = ModelSettings(ctx_len=S.ctx_len, n_parallel=4, n_gpu_layers=10)
    e = estimate(LAYOUT, s, gpus=[GpuBudget("CUDA0", 70 * GiB)], host_available_bytes=64 * GiB)
    assert (e.verdict, e.gpu_layers) == ("partial", 10)
    assert estimate(LAYOUT, s, gpus=[GpuBudget("CUDA0", 100 * MiB)], host_available_bytes=64 * GiB).verdict == "none"


def test_a_head_larger_than_the_gpus_largest_matrix_stays_on_the_host() -> None:
    tied = ModelLayout(**{**LAYOUT.__dict__, "output_bytes": 0, "tied_output_bytes": 125 * MiB})
    big = estimate(tied, S, gpus=[GpuBudget("Vulkan0", 70 * GiB)], host_available_bytes=64 * GiB)
    small = estimate(tied, S, gpus=[GpuBudget("Vulkan0", 70 * GiB, max_tensor_bytes=64 * MiB)],
                     host_available_bytes=64 * GiB)
    assert big.gpu_bytes - small.gpu_bytes == 125 * MiB  # lavapipe's case: the copy of the embeddings not made
