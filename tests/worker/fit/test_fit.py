"""GPU fit plans and the device inventory, on made-up devices (no GPU needed)."""

from __future__ import annotations

import json
import os
import struct

import pytest

from corral import wire
from corral.fit.layout import ModelLayout, read_layout
from corral.fit.plan import FitError, plan_fit

MiB = 1024 * 1024
GiB = 1024 * MiB

# a 1.1B-like model: 22 layers of 40 MiB, 125 MiB output head, 125 MiB embeddings
LAYOUT = ModelLayout(architecture="llama", n_layer=22, n_embd=2048, n_head_kv=4, head_dim_k=64, head_dim_v=64,
                     n_vocab=32000, layer_bytes=(40 * MiB,) * 22, output_bytes=125 * MiB, input_bytes=125 * MiB)


def gpu(free: int, total: int = 80 * GiB) -> wire.DeviceInfo:
    return wire.DeviceInfo(index=0, name="CUDA0", backend="CUDA", kind="gpu", free_bytes=free, total_bytes=total)


def test_everything_fits_on_a_big_device() -> None:
    p = plan_fit(LAYOUT, device=gpu(80 * GiB), ctx_len=32768, n_slots=4, ctx_floor_per_slot=1024)
    assert (p.n_gpu_layers, p.ctx_len) == (23, 32768)
    assert p.host_bytes == LAYOUT.input_bytes  # only the input layer stays on the host
    assert p.device_bytes <= 80 * GiB - p.margin_bytes


def test_context_comes_down_before_layers_move() -> None:
    full_at_4k = plan_fit(LAYOUT, device=gpu(80 * GiB), ctx_len=4096, n_slots=4, ctx_floor_per_slot=1024)
    free = full_at_4k.device_bytes + full_at_4k.margin_bytes + 10 * MiB
    p = plan_fit(LAYOUT, device=gpu(free), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    assert p.n_gpu_layers == 23
    assert 4096 <= p.ctx_len < 65536 and p.ctx_len % (256 * 4) == 0
    assert p.device_bytes <= free - p.margin_bytes
    assert "context 65536 ->" in p.notes


def test_layers_go_to_the_host_at_the_context_floor() -> None:
    p = plan_fit(LAYOUT, device=gpu(GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    assert p.ctx_len == 4096  # the floor: 1024 per slot
    assert 0 < p.n_gpu_layers < 23
    assert p.device_bytes <= GiB - p.margin_bytes
    more = plan_fit(LAYOUT, device=gpu(2 * GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    assert more.n_gpu_layers > p.n_gpu_layers  # more room, more layers
    assert more.host_bytes < p.host_bytes


def test_a_device_with_no_room_gets_no_layers() -> None:
    p = plan_fit(LAYOUT, device=gpu(256 * MiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024)
    assert p.n_gpu_layers == 0 and p.device_bytes == 0


def test_refused_when_the_host_cannot_hold_the_rest() -> None:
    with pytest.raises(FitError, match="does not fit: CUDA0 has 256 MiB free.*host would need"):
        plan_fit(LAYOUT, device=gpu(256 * MiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024,
                 host_available_bytes=100 * MiB)


def test_layout_of_the_embedded_model() -> None:
    from corral.store.embedded import embedded_model_path

    path = embedded_model_path()
    lo = read_layout(path)
    assert lo.architecture == "gemma3" and lo.n_layer == 18
    assert lo.n_vocab == 262144 and lo.n_embd == 640
    size = os.path.getsize(path)
    assert 0.8 * size < lo.weight_bytes <= size  # the tensors are most of the file
    assert all(b > 0 for b in lo.layer_bytes)
    assert lo.sliding_window == 512


def test_fake_devices_replace_the_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.worker.host import devices
    monkeypatch.setenv(devices.FAKE_DEVICES_ENV, json.dumps(
        [{"name": "CUDA0", "backend": "CUDA", "free_bytes": 70 * GiB, "total_bytes": 80 * GiB}]))
    got = devices.list_devices()
    assert [(d.name, d.kind, d.free_bytes) for d in got] == [("CUDA0", "gpu", 70 * GiB)]
    assert devices.gpu_devices(got) == got


def test_real_inventory_lists_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.worker.host import devices
    from corral.worker.llama_context import init_backend as _init_backend

    monkeypatch.delenv(devices.FAKE_DEVICES_ENV, raising=False)
    _init_backend(False)
    got = devices.list_devices()
    cpus = [d for d in got if d.kind == "cpu"]
    assert cpus and cpus[0].backend == "CPU"


# ---------------------------------------------------------------- several GPUs


def gpus(*free: int) -> list[wire.DeviceInfo]:
    return [wire.DeviceInfo(index=k, name=f"CUDA{k}", backend="CUDA", kind="gpu", free_bytes=f, total_bytes=80 * GiB)
            for k, f in enumerate(free)]


def test_one_device_plans() -> None:
    """One device, plans pinned. With 1 GiB at the floor (4096 cells, 4 MiB of KV per layer,
    a compute estimate of 134.5 MiB, a budget of 512 MiB): n_gpu_layers = 6 is the head
    (125 MiB) and the last 5 layers, as llama.cpp places them; 7 would need 523.5 MiB. With
    700 MiB even the head alone (and the compute buffer) does not fit: 0."""
    kv, compute = 4 * MiB, 4 * 512 * 32000 + 4 * 512 * 16 * 2048 + 4 * 512 * 4096
    want = {80 * GiB: (23, 65536, 2671247360, 131072000), 2 * GiB: (23, 18432, 1610088448, 131072000),
            GiB: (6, 4096, 125 * MiB + 5 * (40 * MiB + kv) + compute, 125 * MiB + 17 * (40 * MiB + kv)),
            700 * MiB: (0, 4096, 0, 250 * MiB + 22 * (40 * MiB + kv))}
    for free, numbers in want.items():
        for p in (plan_fit(LAYOUT, device=gpu(free), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024),
                  plan_fit(LAYOUT, devices=gpus(free), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)):
            assert (p.n_gpu_layers, p.ctx_len, p.device_bytes, p.host_bytes) == numbers
            assert p.device == "CUDA0" and p.free_bytes == free and p.devices == []


def test_two_devices_split_the_layers_by_free_memory_as_llama_cpp_does() -> None:
    ctx, ub = 8192, 512
    kv = LAYOUT.kv_bytes_per_cell() * ctx  # per layer (no sliding window)
    logits = 4 * ub * LAYOUT.n_vocab
    act = 4 * ub * 16 * LAYOUT.n_embd + 4 * ub * 4096
    for free, first in (((40 * GiB, 40 * GiB), 12), ((60 * GiB, 20 * GiB), 18)):
        p = plan_fit(LAYOUT, devices=gpus(*free), ctx_len=ctx, n_slots=2, ctx_floor_per_slot=1024)
        assert (p.n_gpu_layers, p.ctx_len) == (23, ctx)
        # 23 units (22 layers + the head); unit u goes to the first GPU whose share of the
        # free memory exceeds u/23: 12 units on GPU 0 at 1:1, 18 at 3:1
        assert [d.bytes for d in p.devices] == [first * (40 * MiB + kv) + act,
                                                (22 - first) * (40 * MiB + kv) + 125 * MiB + act + logits]
        assert [(d.index, d.name) for d in p.devices] == [(0, "CUDA0"), (1, "CUDA1")]
        assert p.device == "CUDA0,CUDA1" and p.device_bytes == sum(d.bytes for d in p.devices)
        assert p.host_bytes == LAYOUT.input_bytes


def test_auto_on_two_small_devices_plans_more_than_on_one() -> None:
    one = plan_fit(LAYOUT, devices=gpus(GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    two = plan_fit(LAYOUT, devices=gpus(GiB, GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    assert (one.n_gpu_layers, one.ctx_len) == (6, 4096)
    assert (two.n_gpu_layers, two.ctx_len) == (13, 4096)  # GPU 1 holds the head and the logits: the tighter one
    assert all(d.bytes <= GiB - two.margin_bytes for d in two.devices)
    assert two.host_bytes < one.host_bytes
    roomy = plan_fit(LAYOUT, devices=gpus(2 * GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    roomier = plan_fit(LAYOUT, devices=gpus(2 * GiB, 2 * GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    assert roomy.n_gpu_layers == roomier.n_gpu_layers == 23 and roomier.ctx_len > roomy.ctx_len  # more context


def test_each_device_stays_within_its_limit() -> None:
    free = plan_fit(LAYOUT, devices=gpus(2 * GiB, 2 * GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    capped = plan_fit(LAYOUT, devices=gpus(2 * GiB, 2 * GiB), limits=[None, 300 * MiB], ctx_len=65536, n_slots=4,
                      ctx_floor_per_slot=1024)
    assert capped.devices[1].bytes <= 300 * MiB < free.devices[1].bytes
    assert capped.devices[1].free_bytes == 300 * MiB + capped.margin_bytes
    assert (capped.n_gpu_layers, capped.ctx_len) < (free.n_gpu_layers, free.ctx_len)
    with pytest.raises(FitError, match="CUDA0 has 256 MiB free and CUDA1 has 256 MiB free"):
        plan_fit(LAYOUT, devices=gpus(256 * MiB, 256 * MiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024,
                 host_available_bytes=100 * MiB)


def test_the_routers_estimate_splits_the_same_way() -> None:
    from corral.fit.plan import device_need, device_needs
    from corral.model.settings import ModelSettings

    fixed = ModelSettings(ctx_len=8192, n_parallel=2, n_gpu_layers=-1)
    one = device_need(LAYOUT, fixed, budget_bytes=GiB)
    a, b = device_needs(LAYOUT, fixed, budgets=[GiB, GiB])
    assert a > 0 and b > 0 and a + b == one + 4 * 512 * (16 * LAYOUT.n_embd + 4096)  # GPU 0's activations
    auto = ModelSettings(ctx_len=65536, n_parallel=4, fit_ctx_floor=1024)
    plan = plan_fit(LAYOUT, devices=gpus(GiB, GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024, margin_bytes=0,
                    outputs=4 + 32)  # fit.rows.outputs_max: a row a slot, 32 echo rows
    assert device_needs(LAYOUT, auto, budgets=[GiB, GiB]) == [d.bytes for d in plan.devices]


def test_the_worker_plans_over_every_gpu_it_sees_within_the_routers_budgets() -> None:
    import msgspec

    from corral.store.embedded import embedded_model_path
    from corral.worker.fit import fit_gpus as _fit

    base = {"model_id": "m", "model_path": str(embedded_model_path()), "ctx_len": 32768, "n_parallel": 2,
            "fit_ctx_floor": 512, "gpu_margin_bytes": 0}
    s = msgspec.convert({**base, "gpu_budget_bytes": [800 * MiB, 800 * MiB]}, wire.WorkerSettings)
    plan = _fit(s, [*gpus(80 * GiB, 80 * GiB), wire.DeviceInfo(index=2, name="CPU", backend="CPU", kind="cpu",
                                                                   free_bytes=GiB, total_bytes=GiB)])
    assert plan is not None and [d.name for d in plan.devices] == ["CUDA0", "CUDA1"]
    assert (plan.n_gpu_layers, plan.ctx_len) == (19, 32768)  # all of it on two 800 MiB GPUs (34 rows of logits)
    assert plan.tensor_split == []  # none given: llama.cpp splits by free memory (as the plan did)
    # settings from before per-GPU budgets (one int): the first GPU's
    old = msgspec.json.decode(msgspec.json.encode({**base, "gpu_budget_bytes": 600 * MiB}), type=wire.WorkerSettings)
    plan = _fit(old, gpus(80 * GiB, 80 * GiB))
    assert plan is not None and plan.devices[0].free_bytes == 600 * MiB and plan.devices[1].free_bytes == 80 * GiB
    assert plan.devices[0].bytes <= 600 * MiB


def test_the_head_goes_first_and_a_tied_head_is_a_copy_of_the_embeddings() -> None:
    """As llama.cpp places them: n_gpu_layers = 1 is the output head alone; a model without
    output.weight (tied embeddings) gets a copy of the token embeddings there."""
    from corral.fit.sizes import Sizes

    tied = ModelLayout(**{**LAYOUT.__dict__, "tied_output_bytes": 300 * MiB})
    for lo, head in ((LAYOUT, 125 * MiB), (tied, 425 * MiB)):
        s = Sizes(lo, 1, 512)
        compute = s.compute(1024)
        assert s.on_device(1, 1024) == head + compute
        assert s.on_device(2, 1024) == head + 40 * MiB + s.kv_layer(21, 1024) + compute  # and the last layer
        assert s.on_host(1, 1024) == lo.input_bytes + 22 * 40 * MiB + sum(s.kv_layer(i, 1024) for i in range(22))
        assert s.on_host(0, 1024) == s.on_host(1, 1024) + lo.output_bytes  # the host copy stays with the input


def test_a_head_too_large_for_the_device_stays_on_the_host() -> None:
    """As llama.cpp's ``select_weight_buft`` does on a device whose ``supports_op`` refuses a
    matrix that large (Vulkan past maxStorageBufferRange: 128 MiB on lavapipe, where the
    embedded Gemma's 170 MiB tied head stays on the host, measured in tests/gpu): a tied head
    then costs nothing of its own; an output.weight counts on the host. The limit of the last
    GPU counts (it holds the head)."""
    from corral.fit.sizes import Sizes

    def gpu(limit: int) -> wire.DeviceInfo:
        return wire.DeviceInfo(index=0, name="Vulkan0", backend="Vulkan", kind="gpu", free_bytes=8 * GiB,
                               total_bytes=8 * GiB, max_tensor_bytes=limit)

    tied = ModelLayout(**{**LAYOUT.__dict__, "tied_output_bytes": 300 * MiB})
    assert tied.on_devices([gpu(0)]) == tied.on_devices([gpu(300 * MiB)]) == tied.on_devices([]) == tied
    assert tied.on_devices([gpu(128 * MiB)]).head_bytes == LAYOUT.output_bytes  # the norm and the rest, no copy
    assert tied.on_devices([gpu(1 * GiB), gpu(128 * MiB)]).head_bytes == LAYOUT.output_bytes
    assert tied.on_devices([gpu(128 * MiB), gpu(1 * GiB)]) == tied
    own = LAYOUT.on_devices([gpu(100 * MiB)])  # a 125 MiB output.weight
    assert own.head_bytes == 0 and own.input_bytes == LAYOUT.input_bytes + LAYOUT.output_bytes
    s, host = Sizes(own, 1, 512), Sizes(LAYOUT, 1, 512)
    assert s.on_device(23, 1024) == host.on_device(23, 1024) - LAYOUT.output_bytes
    assert s.on_host(23, 1024) == host.on_host(23, 1024) + LAYOUT.output_bytes


def test_the_embedded_gemma_has_a_tied_head() -> None:
    from corral.store.embedded import embedded_model_path

    lo = read_layout(embedded_model_path())
    assert lo.tied_output_bytes > 100 * MiB  # 262144 x 640 token embeddings


def test_tensor_split_sets_the_proportions() -> None:
    """The tensor_split splits the layers as llama.cpp splits them when given it (3:1 on
    two equal GPUs places as 3:1 free memory does); the plan reports the float32 values
    llama.cpp is given; a GPU that gets nothing need not have room."""
    by_free = plan_fit(LAYOUT, devices=gpus(60 * GiB, 20 * GiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024)
    given = plan_fit(LAYOUT, devices=gpus(40 * GiB, 40 * GiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024,
                     tensor_split=[3, 1])
    assert [d.bytes for d in given.devices] == [d.bytes for d in by_free.devices]
    assert given.tensor_split == [3.0, 1.0] and by_free.tensor_split == []  # none: llama.cpp splits by free memory
    tenth = plan_fit(LAYOUT, devices=gpus(40 * GiB, 40 * GiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024,
                     tensor_split=[0.1, 0.9])
    assert tenth.tensor_split == [struct.unpack("f", struct.pack("f", 0.1))[0], struct.unpack("f", struct.pack("f", 0.9))[0]]
    full = plan_fit(LAYOUT, devices=gpus(40 * GiB, 100 * MiB), ctx_len=8192, n_slots=2, ctx_floor_per_slot=1024,
                    tensor_split=[1])  # padded to [1, 0]; GPU 1 has less than the margin free
    assert full.tensor_split == [1.0, 0.0] and full.devices[1].bytes == 0 and full.n_gpu_layers == 23


def test_the_worker_plans_what_the_router_charged() -> None:
    """An "auto" model pinned to two GPUs, one of them half taken by another model: the
    router estimates its need on the whole budgets and sends that split as tensor_split;
    the worker, planning within what is left of each budget, places the same bytes."""
    from corral.fit.rows import outputs_max
    from corral.fit.plan import device_needs
    from corral.fit.split import router_split
    from corral.model.settings import ModelSettings

    auto = ModelSettings(ctx_len=65536, n_parallel=4, fit_ctx_floor=1024, devices=[0, 1])
    budgets, free = [4 * GiB, 2 * GiB], [4 * GiB + 512 * MiB, 2 * GiB + 512 * MiB]
    need = device_needs(LAYOUT, auto, budgets=budgets, free=free)
    split = router_split(auto, budgets, free)
    assert split == [4.0 * GiB, 2.0 * GiB]
    room = [3 * GiB, need[1]]  # GPU 0 has another model on it, GPU 1 just enough
    real = gpus(room[0] + 512 * MiB, 2 * GiB + 512 * MiB)  # the worker sees the other model's memory as used
    rows = outputs_max(auto, 4)  # as the worker's _fit plans
    plan = plan_fit(LAYOUT, devices=real, limits=room, ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024,
                    tensor_split=split, outputs=rows)
    assert [d.bytes for d in plan.devices] == need and plan.ctx_len == 65536
    unsplit = plan_fit(LAYOUT, devices=real, limits=room, ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024,
                       outputs=rows)
    assert [d.bytes for d in unsplit.devices] != need  # by free memory it would not be what was charged
    fixed = ModelSettings(ctx_len=8192, n_parallel=2, n_gpu_layers=-1, devices=[0, 1])
    assert router_split(fixed, budgets, [60, 20]) == [60.0, 20.0]  # a fixed count: by free memory, as llama.cpp
    assert router_split(fixed.__class__(**{**fixed.to_dict(), "tensor_split": [1, 3]}), budgets, free) == [1.0, 3.0]
    assert router_split(auto, [GiB], [GiB]) is None  # one GPU: no split


def test_the_worker_refuses_more_proportions_than_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import msgspec

    from corral.store.embedded import embedded_model_path
    from corral.worker.host.devices import FAKE_DEVICES_ENV
    from corral.worker.model import ModelLoadError, load_model

    monkeypatch.setenv(FAKE_DEVICES_ENV, json.dumps([{"name": f"CUDA{k}", "free_bytes": GiB, "total_bytes": GiB}
                                                     for k in range(2)]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = msgspec.convert({"model_id": "m", "model_path": str(embedded_model_path()), "tensor_split": [1, 1, 1]},
                        wire.WorkerSettings)
    with pytest.raises(ModelLoadError, match=r"tensor_split has 3 entries but this instance sees 2 GPU\(s\) "
                                             r"\(CUDA0, CUDA1\)"):
        load_model(s)


def test_placement_says_where_the_layers_and_kv_are() -> None:
    """As llama.cpp places them: n_gpu_layers = 10 is the head and the last 9 layers on the
    GPUs (here split 1:1 by the weights given), the rest on the host; every byte of the
    plan is in exactly one place."""
    from corral.fit.plan import placement
    from corral.fit.sizes import Sizes

    ctx = 8192
    kv = LAYOUT.kv_bytes_per_cell() * ctx
    parts = placement(LAYOUT, gpus=gpus(GiB, GiB), weights=[1.0, 1.0], ngl=10, ctx=ctx, n_slots=2, n_ubatch=512)
    assert [(p.device, p.first_layer, p.layers, p.output) for p in parts] == [
        ("CUDA0", 13, 5, False), ("CUDA1", 18, 4, True), ("CPU", 0, 13, False)]
    s = Sizes(LAYOUT, 2, 512, (0.5, 1.0))
    assert [p.weight_bytes + p.kv_bytes + p.compute_bytes for p in parts[:2]] == s.per_device(10, ctx)  # the plan's
    assert parts[2].weight_bytes + parts[2].kv_bytes == s.on_host(10, ctx)
    assert [p.compute_bytes for p in parts] == [s.compute(ctx) - s.logits(), s.compute(ctx), 0]  # logits: the head's
    assert [p.kv_bytes for p in parts] == [5 * kv, 4 * kv, 13 * kv]
    assert sum(p.weight_bytes for p in parts) == LAYOUT.weight_bytes

    [host] = placement(LAYOUT, gpus=[], weights=None, ngl=-1, ctx=ctx, n_slots=2, n_ubatch=512)  # no GPU
    assert (host.layers, host.output, host.weight_bytes, host.kv_bytes) == (22, True, LAYOUT.weight_bytes, 22 * kv)
    *on_gpu, host = placement(LAYOUT, gpus=gpus(GiB), weights=None, ngl=-1, ctx=ctx, n_slots=2, n_ubatch=512)
    assert [(p.first_layer, p.layers, p.output) for p in on_gpu] == [(0, 22, True)]
    assert (host.first_layer, host.layers, host.weight_bytes, host.kv_bytes) == (-1, 0, LAYOUT.input_bytes, 0)


def test_a_quantized_kv_cache_is_counted_so_and_fits_more_context() -> None:
    from corral.fit.plan import device_need
    from corral.model.settings import ModelSettings

    # 4 KV heads of 64: a row is 128 bytes in f16, 2 blocks of 34 in q8_0, 2 of 18 in q4_0
    assert LAYOUT.kv_bytes_per_cell() == 4 * (128 + 128)
    assert LAYOUT.kv_bytes_per_cell("q8_0", "q8_0") == 4 * (68 + 68)
    assert LAYOUT.kv_bytes_per_cell("q4_0", "f32") == 4 * (36 + 256)
    f16 = plan_fit(LAYOUT, device=gpu(2 * GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024)
    q8 = plan_fit(LAYOUT, device=gpu(2 * GiB), ctx_len=65536, n_slots=4, ctx_floor_per_slot=1024,
                  cache_types=("q8_0", "q8_0"))
    assert f16.n_gpu_layers == q8.n_gpu_layers == 23 and q8.ctx_len > f16.ctx_len
    both = {"ctx_len": 8192, "n_parallel": 2, "n_gpu_layers": -1}
    plain = device_need(LAYOUT, ModelSettings(**both), budget_bytes=GiB)  # type: ignore[arg-type]
    small = device_need(LAYOUT, ModelSettings(**both, cache_type_k="q8_0", cache_type_v="q8_0"),  # type: ignore[arg-type]
                        budget_bytes=GiB)
    assert plain - small == 22 * 8192 * 4 * (256 - 136)  # the router's estimate counts it too


def test_layers_are_offloaded_to_the_devices_llama_cpp_uses_in_its_order() -> None:
    from corral.worker.host.devices import offload_devices

    def dev(k: int, name: str, kind: str = "gpu") -> wire.DeviceInfo:
        return wire.DeviceInfo(index=k, name=name, backend=name.rstrip("0123456789"), kind=kind, free_bytes=GiB,
                               total_bytes=GiB)

    cpu, cuda, igpu = dev(9, "CPU", "cpu"), dev(0, "CUDA0"), dev(2, "Vulkan0", "igpu")
    assert offload_devices([cpu, cuda, igpu]) == [cuda]  # an integrated GPU only when there is no other
    assert offload_devices([cpu, igpu, dev(3, "Vulkan1", "igpu"), dev(4, "SYCL0", "igpu")]) == [
        igpu, dev(3, "Vulkan1", "igpu")]  # those of the first one's backend
    assert offload_devices([cuda, dev(5, "RPC0")]) == [dev(5, "RPC0"), cuda]  # RPC servers first
    assert offload_devices([cpu]) == []


def test_the_kv_cache_types_are_the_ones_llama_cpp_knows() -> None:
    import typing

    import llama_cpp as ll

    from corral.model.settings import KV_CACHE_TYPES, CacheType
    from corral.worker.llama_context import GGML_TYPES as _GGML_TYPES

    assert set(typing.get_args(CacheType)) == set(KV_CACHE_TYPES) == set(_GGML_TYPES)
    for name, ggml_id in _GGML_TYPES.items():
        if name != "bf16":  # not exported by the bindings: 30 in ggml.h
            assert getattr(ll, f"GGML_TYPE_{name.upper()}") == ggml_id, name


def test_kv_cells_are_padded_as_llama_cpp_pads_them() -> None:
    from corral.fit.sizes import Sizes

    swa = ModelLayout(**{**LAYOUT.__dict__, "sliding_window": 512, "swa_pattern": 6})
    s = Sizes(swa, 3, 512)
    cell = LAYOUT.kv_bytes_per_cell()
    assert s.kv_layer(5, 4096) == cell * 1536 * 3  # 4096 // 3 = 1365 per slot, padded to 1536
    assert s.kv_layer(0, 4096) == cell * 1024 * 3  # a window layer: min(1536, 512 + 512)
    assert Sizes(swa, 3, 300).kv_layer(0, 4096) == cell * 1024 * 3  # 812 cells, padded to 1024


def test_the_estimate_counts_the_logits_rows_asked_for_and_a_projectors_side_context() -> None:
    """The compute buffer holds the logits rows the worker's context may ask for
    (fit.rows.outputs_max: a token a slot, the drafts with speculation, the echo rows),
    not a whole micro-batch's; a model with a vision projector keeps room for the side
    context from the start (one more slot's KV with every layer, its activations and one
    row of logits), where the worker creates it on the first image beside other streams."""
    import msgspec

    from corral.fit.rows import ECHO_CHUNK
    from corral.fit.plan import device_need
    from corral.model.settings import ModelSettings

    plain = ModelSettings(ctx_len=8192, n_parallel=4, n_gpu_layers=-1)
    need = device_need(LAYOUT, plain, budget_bytes=80 * GiB)
    row = 4 * LAYOUT.n_vocab
    activations = 4 * 512 * (16 * LAYOUT.n_embd + 4096)
    assert need == LAYOUT.weight_bytes - LAYOUT.input_bytes + 22 * LAYOUT.kv_bytes_per_cell() * 8192 + (
        (4 + ECHO_CHUNK) * row + activations)  # 36 rows of logits, not 512
    spec = msgspec.structs.replace(plain, speculative="ngram", draft_max=8)
    assert device_need(LAYOUT, spec, budget_bytes=80 * GiB) - need == 4 * 8 * row  # each slot's drafts
    vision = msgspec.structs.replace(plain, mmproj="mmproj-x.gguf")
    side = 22 * LAYOUT.kv_bytes_per_cell() * 2048 + 4 * 512 * (16 * LAYOUT.n_embd + 2048) + row
    assert device_need(LAYOUT, vision, budget_bytes=80 * GiB) - need == side
    embeds = msgspec.structs.replace(vision, embedding=True)  # no side context, and a micro-batch of rows
    assert device_need(LAYOUT, embeds, budget_bytes=80 * GiB) - need == (512 - 4 - ECHO_CHUNK) * row
    # auto: the worker's plan keeps the same room (the same numbers on both sides)
    auto = msgspec.structs.replace(vision, n_gpu_layers="auto", fit_ctx_floor=1024)
    plan = plan_fit(LAYOUT, device=gpu(80 * GiB), ctx_len=8192, n_slots=4, ctx_floor_per_slot=1024, margin_bytes=0,
                    outputs=4 + ECHO_CHUNK, side=True)
    assert device_need(LAYOUT, auto, budget_bytes=80 * GiB) == plan.device_bytes == need + side
