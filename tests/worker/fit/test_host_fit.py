"""The default slot context (32,768 cells) and its fit to the host's RAM with no GPU
(``corral.worker.fit.fit_host_ctx``), on a made-up layout; a real worker's load with it:
``tests/e2e/test_gpu_fit.py``."""

from __future__ import annotations

import pytest

from corral import wire
from corral.fit.rows import outputs_max
from corral.fit.layout import ModelLayout
from corral.fit.plan import placement
from corral.model.settings import DEFAULT_SLOT_CTX, ModelSettings
from corral.worker.fit import fit_host_ctx

MiB = 1024 * 1024
GiB = 1024 * MiB

# a 1.1B-like model: 22 layers of 40 MiB, 4 KV heads of 64 (22 KiB of f16 KV a cell), trained on 32k
LAYOUT = ModelLayout(architecture="llama", n_layer=22, n_embd=2048, n_head_kv=4, head_dim_k=64, head_dim_v=64,
                     n_vocab=32000, layer_bytes=(40 * MiB,) * 22, output_bytes=125 * MiB, input_bytes=125 * MiB,
                     n_ctx_train=32768)


def settings(**kw: object) -> wire.WorkerSettings:
    return wire.WorkerSettings(**{"model_id": "m", "model_path": "/m.gguf", **kw})  # type: ignore[arg-type]


def host_bytes(s: wire.WorkerSettings, cells: int) -> int:
    """Weights and KV on the host at ``cells``, as the worker counts them."""
    parts = placement(LAYOUT, gpus=[], weights=None, ngl=0, ctx=cells, n_slots=s.n_parallel, n_ubatch=512,
                      outputs=outputs_max(s, s.n_parallel))
    return sum(p.weight_bytes + p.kv_bytes for p in parts)


def test_an_unset_context_is_32k_a_slot_and_zero_means_unset() -> None:
    assert DEFAULT_SLOT_CTX == 32768
    assert ModelSettings().n_parallel == "auto" and ModelSettings().slot_ctx() == 32768  # auto: ctx_len is a slot's
    assert ModelSettings(n_parallel=4).ctx_len == 4 * 32768 and ModelSettings(n_parallel=2).ctx_len == 2 * 32768
    assert ModelSettings.layered([{"ctx_len": 4096}, {"n_parallel": 8}, {"ctx_len": 0}]).ctx_len == 8 * 32768
    assert ModelSettings(n_parallel=8, ctx_len=4096).slot_ctx() == 512 and ModelSettings(ctx_len=4096).slot_ctx() == 4096
    assert ModelSettings(ctx_len=100).ctx_len == 100  # a context that is set is kept
    from corral.model.settings import SettingsError

    with pytest.raises(SettingsError, match=r"ctx_len: Expected `int` >= 16, or 0"):
        ModelSettings.check_partial({"ctx_len": 15})


def test_a_context_that_fits_is_kept_and_each_slot_is_capped_at_n_ctx_train() -> None:
    s = settings(ctx_len=8192, n_parallel=4)
    assert fit_host_ctx(s, LAYOUT, 64 * GiB) == 8192
    assert fit_host_ctx(s, None, 1) == 8192  # an unreadable file: as asked, llama.cpp decides
    big = settings(n_parallel=4)  # unset: 4 x 32768, and 4 x 32768 cells is the cap
    assert big.ctx_len == 4 * 32768 and fit_host_ctx(big, LAYOUT, 64 * GiB) == 4 * 32768
    over = settings(ctx_len=4 * 65536, n_parallel=4)
    assert fit_host_ctx(over, LAYOUT, 64 * GiB) == 4 * 32768
    assert fit_host_ctx(over, LAYOUT, None) == 4 * 32768  # no MemAvailable: only the cap
    untrained = settings(ctx_len=4 * 65536, n_parallel=4)
    assert fit_host_ctx(untrained, ModelLayout(**{**LAYOUT.__dict__, "n_ctx_train": 0}), 64 * GiB) == 4 * 65536


@pytest.mark.parametrize("n_parallel", [1, 4])
def test_the_context_shrinks_in_whole_256_cell_slots_to_half_the_available_memory(n_parallel: int) -> None:
    s = settings(n_parallel=n_parallel)
    step = 256 * n_parallel
    full = host_bytes(s, s.ctx_len)
    # twice the weights and KV of 2,000, 4,096 and 20,000 cells a slot, and just under twice the whole
    for available in (2 * host_bytes(s, 2000 * n_parallel), 2 * host_bytes(s, 4096 * n_parallel),
                      2 * host_bytes(s, 20000 * n_parallel) + 5 * MiB, 2 * full - 1):
        ctx = fit_host_ctx(s, LAYOUT, available)
        assert ctx < s.ctx_len and ctx % step == 0
        assert host_bytes(s, ctx) <= available // 2 < host_bytes(s, ctx + step)  # the largest that fits
    assert fit_host_ctx(s, LAYOUT, 2 * host_bytes(s, 4096 * n_parallel)) == 4096 * n_parallel
    assert fit_host_ctx(s, LAYOUT, 2 * full) == s.ctx_len  # exactly half: kept


def test_the_context_stops_at_fit_ctx_floor() -> None:
    s = settings(n_parallel=4, fit_ctx_floor=1024)
    assert fit_host_ctx(s, LAYOUT, 100 * MiB) == 4 * 1024  # the weights alone are over: the floor, llama.cpp decides
    small = settings(n_parallel=4, ctx_len=2048, fit_ctx_floor=1024)
    assert fit_host_ctx(small, LAYOUT, 100 * MiB) == 2048  # never above what was asked
