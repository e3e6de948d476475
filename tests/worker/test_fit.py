"""GPU fit plans and the device inventory, on made-up devices (no GPU needed)."""

from __future__ import annotations

import json
import os

import pytest

from corral import wire
from corral.gpu_fit import FitError, ModelLayout, plan_fit, read_layout

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
    from corral.worker import devices

    monkeypatch.setenv(devices.FAKE_DEVICES_ENV, json.dumps(
        [{"name": "CUDA0", "backend": "CUDA", "free_bytes": 70 * GiB, "total_bytes": 80 * GiB}]))
    got = devices.list_devices()
    assert [(d.name, d.kind, d.free_bytes) for d in got] == [("CUDA0", "gpu", 70 * GiB)]
    assert devices.gpu_devices(got) == got


def test_real_inventory_lists_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.worker import devices
    from corral.worker.model import _init_backend

    monkeypatch.delenv(devices.FAKE_DEVICES_ENV, raising=False)
    _init_backend(False)
    got = devices.list_devices()
    cpus = [d for d in got if d.kind == "cpu"]
    assert cpus and cpus[0].backend == "CPU"
