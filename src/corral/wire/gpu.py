"""The wire types a worker reports about GPUs: the devices it sees, its fit plan and
where it placed the model. Re-exported by ``corral.wire``
(import them from there). Imports nothing of corral."""

from __future__ import annotations

import msgspec

__all__ = ["DeviceInfo", "DevicePlan", "DevicePlacement", "BufferSize", "FitPlan", "host_and_gpu_bytes"]


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A compute device the worker sees (llama.cpp's device registry)."""

    index: int
    name: str  # "CUDA0", "Vulkan1", "CPU"
    backend: str  # "CUDA", "Vulkan", "CPU"
    kind: str  # cpu | gpu | igpu | accel
    free_bytes: int
    total_bytes: int
    # the largest weight matrix it takes in a matrix product (a Vulkan device's
    # maxStorageBufferRange: 128 MiB on lavapipe); 0: no limit found (CUDA, the CPU)
    max_tensor_bytes: int = 0


class DevicePlan(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU's share of a fit plan over several GPUs."""

    index: int  # among the GPUs the worker sees (0 = the first of its CUDA_VISIBLE_DEVICES)
    name: str
    bytes: int  # planned there: weights + KV of its layers + compute estimate
    free_bytes: int  # its free memory when planned (capped by the router's budget)


class DevicePlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where a loaded instance's parts are on one device (a GPU, or "CPU": the host),
    from the file's tensor table and llama.cpp's placement rules (``corral.fit.plan``)."""

    device: str  # "CUDA0", ..., "CPU"
    first_layer: int  # the first of its repeating layers (-1: none)
    layers: int  # repeating layers there (contiguous from first_layer)
    output: bool  # the output head is there
    weight_bytes: int
    input_bytes: int = 0  # of which the input layer: token embeddings, a lookup llama.cpp keeps on the host
    kv_bytes: int  # KV cache of its layers
    compute_bytes: int  # compute buffer estimate (0 on the host)


class FitPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How ``n_gpu_layers = "auto"`` placed the model (``corral.fit.plan.plan_fit``).
    With one GPU, ``device``/``device_bytes``/``free_bytes`` are that GPU's; with several,
    ``device`` is their names joined by "," and the numbers are totals over them, while
    ``devices`` gives each one's share (empty with one GPU)."""

    n_gpu_layers: int
    n_layers: int  # repeating layers + the output head
    ctx_len: int  # total KV cells planned
    ctx_len_asked: int
    device: str | None
    device_bytes: int  # planned on the GPU(s): weights + KV + compute estimate
    host_bytes: int  # planned on the host: weights + KV of host layers
    free_bytes: int  # the GPU's (GPUs') free memory when planned
    margin_bytes: int  # kept free on each GPU
    notes: str
    devices: list[DevicePlan] = []  # several GPUs: each one's share (layers split as llama.cpp does)
    # several GPUs: the proportions llama.cpp was given for them (``tensor_split``); empty: it
    # split by their free memory
    tensor_split: list[float] = []


class BufferSize(msgspec.Struct, frozen=True, kw_only=True):
    """A buffer llama.cpp allocated at the load, as it logged it ("CUDA0 KV buffer size =
    ... MiB"): measured, where ``DevicePlacement`` is computed."""

    buffer: str  # "CUDA0", "CPU", "CPU_Mapped", "CUDA_Host", ...
    kind: str  # model | kv | compute | output | lora (a LoRA adapter's tensors)
    bytes: int  # to about 5 KiB (the log prints MiB with two decimals)


def host_and_gpu_bytes(placement: list[DevicePlacement]) -> tuple[int, int]:
    """What of a placement runs on the host and on GPUs, as ``ollama ps`` counts it: the
    devices' weights, KV and compute; the host's weights and KV less the token embeddings
    (a lookup llama.cpp keeps on the host in every case: a model with every layer on a GPU
    is 100% GPU)."""
    gpu = sum(p.weight_bytes + p.kv_bytes + p.compute_bytes for p in placement if p.device != "CPU")
    host = sum(p.weight_bytes - p.input_bytes + p.kv_bytes for p in placement if p.device == "CPU")
    return host, gpu
