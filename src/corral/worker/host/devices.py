"""The compute devices this worker sees, from llama.cpp's device API (``ggml_backend_dev_*``).

llama-cpp-python ships the ggml libraries next to ``libllama``; their device registry
lists every backend device (CPU, CUDA0, Vulkan0, ...) with its free and total memory.
The worker reports them in ``Ready`` so the router can place instances and keep a
per-device memory budget. ``CUDA_VISIBLE_DEVICES`` (and the HIP/Vulkan equivalents),
set by the router before the worker starts, decide which GPUs a worker sees.

Test hook: ``CORRAL_FAKE_DEVICES`` (a JSON list of ``{"name", "backend", "kind",
"free_bytes", "total_bytes"}``) replaces the inventory, so placement, fit plans and
per-device budgets are testable on a machine without a GPU; a ``"kind": "cpu"`` entry's
``free_bytes`` stands for the host's ``MemAvailable`` (``host_available_bytes``). It changes
only what is reported and planned; the engine still runs where llama.cpp can.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from corral import wire
from corral.fit.host import mem_available_bytes

__all__ = ["list_devices", "llama_cpp_lib", "FAKE_DEVICES_ENV", "gpu_devices", "offload_devices", "logged_buffers",
           "host_available_bytes", "ggml_amx"]

FAKE_DEVICES_ENV = "CORRAL_FAKE_DEVICES"
# llama-cpp-python's own setting: the directory its bindings load libllama (and so ggml) from
LIB_PATH_ENV = "LLAMA_CPP_LIB_PATH"

# enum ggml_backend_dev_type
_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


def _fake() -> list[wire.DeviceInfo] | None:
    """The test inventory; like CUDA, ``CUDA_VISIBLE_DEVICES`` hides the GPUs it does not
    name and orders the rest as it lists them (the fake's names are kept as given)."""
    raw = os.environ.get(FAKE_DEVICES_ENV)
    if not raw:
        return None
    devs = [wire.DeviceInfo(index=i, name=str(d["name"]), backend=str(d.get("backend", d["name"])),
                            kind=str(d.get("kind", "gpu")), free_bytes=int(d["free_bytes"]),
                            total_bytes=int(d["total_bytes"]))
            for i, d in enumerate(json.loads(raw))]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return devs
    order = [int(x) for x in visible.split(",") if x.strip().isdigit()]
    gpus = [d for d in devs if d.kind == "gpu"]
    return [gpus[k] for k in dict.fromkeys(order) if k < len(gpus)] + [d for d in devs if d.kind != "gpu"]


def llama_cpp_lib(name: str) -> ctypes.CDLL | None:
    """One of llama-cpp-python's libraries (``ggml``, ``ggml-cpu``, ``llama``...), or None:
    from the directory the bindings loaded ``libllama`` from (``LLAMA_CPP_LIB_PATH``, a GPU
    build beside the CPU one: ``make install BACKEND=vulkan``), else the package's own."""
    import llama_cpp

    override = os.environ.get(LIB_PATH_ENV)
    libdir = Path(override) if override else Path(llama_cpp.__file__).parent / "lib"
    for cand in (libdir / f"lib{name}.so", libdir / f"lib{name}.dylib", libdir / f"{name}.dll"):
        if cand.exists():
            try:
                return ctypes.CDLL(str(cand))
            except OSError:
                return None
    return None


@functools.cache
def ggml_amx() -> bool:
    """Whether ggml's CPU backend here would put weights in its AMX buffer: built with AMX
    (``GGML_NATIVE`` on a CPU that has it: ``ggml_cpu_has_amx_int8`` says what the build holds).
    Its matrix product crashes on the embedded Q4_K_M model at the first decode (SIGSEGV in
    ``ggml_backend_amx_mul_mat``, every time, on a Xeon with AMX; llama.cpp issue 20824 has the
    same crash, unfixed), so there the weights load without llama.cpp's extra buffer types
    (llama-server's ``--no-repack``): plain CPU buffers. False when the library or the call is
    missing."""
    cpu = llama_cpp_lib("ggml-cpu")
    has = getattr(cpu, "ggml_cpu_has_amx_int8", None) if cpu is not None else None
    if has is None:
        return False
    has.restype = ctypes.c_int
    has.argtypes = []
    return bool(has())


def _backend_of(name: str) -> str:
    """CUDA0 -> CUDA, Vulkan1 -> Vulkan, CPU -> CPU."""
    return name.rstrip("0123456789") or name


def list_devices() -> list[wire.DeviceInfo]:
    """Every device llama.cpp registered (call after ``llama_backend_init``)."""
    fake = _fake()
    if fake is not None:
        return fake
    ggml = llama_cpp_lib("ggml")
    if ggml is None:
        return []
    try:
        count = ggml.ggml_backend_dev_count
        get = ggml.ggml_backend_dev_get
        dev_name = ggml.ggml_backend_dev_name
        memory = ggml.ggml_backend_dev_memory
        dev_type = ggml.ggml_backend_dev_type
    except AttributeError:
        return []
    count.restype = ctypes.c_size_t
    count.argtypes = []
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.c_size_t]
    dev_name.restype = ctypes.c_char_p
    dev_name.argtypes = [ctypes.c_void_p]
    memory.restype = None
    memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    dev_type.restype = ctypes.c_int
    dev_type.argtypes = [ctypes.c_void_p]
    out: list[wire.DeviceInfo] = []
    for i in range(int(count())):
        dev = get(i)
        if not dev:
            continue
        raw_name = dev_name(dev)
        name = raw_name.decode("utf-8", "replace") if raw_name else f"device{i}"
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = _KINDS.get(int(dev_type(dev)), "unknown")
        out.append(wire.DeviceInfo(index=i, name=name, backend=_backend_of(name), kind=kind,
                                   free_bytes=int(free.value), total_bytes=int(total.value),
                                   max_tensor_bytes=_max_tensor_bytes(ggml, dev) if kind in ("gpu", "igpu") else 0))
    return out


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


_NO_LIMIT = 1 << 40
_ROW = 4096  # bytes of a row of the probe's f32 matrices (1024 columns)


def _max_tensor_bytes(ggml: ctypes.CDLL, dev: int) -> int:
    """The largest weight matrix (to a row of 4 KiB) the device takes in a matrix product,
    as llama.cpp asks it when it places a weight (``supports_op`` on a MUL_MAT; a Vulkan
    device refuses one past its ``maxStorageBufferRange``); 0: none refused up to 1 TiB, or
    the API is missing. Tensor headers only (``no_alloc``): nothing is allocated on the device."""
    try:
        init, free, new_2d, mul_mat = ggml.ggml_init, ggml.ggml_free, ggml.ggml_new_tensor_2d, ggml.ggml_mul_mat
        supports = ggml.ggml_backend_dev_supports_op
    except AttributeError:
        return 0
    init.restype, init.argtypes = ctypes.c_void_p, [_InitParams]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    new_2d.restype, new_2d.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    mul_mat.restype, mul_mat.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    supports.restype, supports.argtypes = ctypes.c_bool, [ctypes.c_void_p, ctypes.c_void_p]
    ctx = init(_InitParams(1 << 20, None, True))
    if not ctx:
        return 0
    try:
        def takes(nbytes: int) -> bool:
            weight = new_2d(ctx, 0, _ROW // 4, max(1, nbytes // _ROW))  # GGML_TYPE_F32
            return bool(supports(dev, mul_mat(ctx, weight, new_2d(ctx, 0, _ROW // 4, 1))))

        if takes(_NO_LIMIT) or not takes(_ROW):
            return 0
        lo, hi = _ROW, _NO_LIMIT  # takes lo, refuses hi: 28 halvings to a row
        while hi - lo > _ROW:
            mid = (lo + hi) // 2 // _ROW * _ROW
            lo, hi = (mid, hi) if takes(mid) else (lo, mid)
        return lo
    finally:
        free(ctx)


def gpu_devices(devices: list[wire.DeviceInfo]) -> list[wire.DeviceInfo]:
    """The devices with memory of their own (dedicated GPUs)."""
    return [d for d in devices if d.kind == "gpu"]


def offload_devices(devices: list[wire.DeviceInfo]) -> list[wire.DeviceInfo]:
    """The devices llama.cpp offloads layers to, in its order (``llama_model_load`` in
    the llama.cpp that llama-cpp-python vendors): RPC servers first, then the GPUs; integrated GPUs
    (those of the first one's backend) only when there is no other GPU. Its ``tensor_split``
    and layer split are over this list. Not mirrored: a GPU that two backends both list
    (the same ``device_id``) is used once by llama.cpp and counted twice here."""
    gpus = gpu_devices(devices)
    rpc = [d for d in gpus if d.backend.startswith("RPC")]
    found = rpc + [d for d in gpus if not d.backend.startswith("RPC")]
    igpus = [d for d in devices if d.kind == "igpu"]
    if len(found) == len(rpc) and igpus:
        found += [d for d in igpus if d.backend == igpus[0].backend]
    return found


def host_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where there is none; the test inventory's CPU
    entry, when it has one)."""
    fake = _fake()
    cpu = next((d for d in fake or [] if d.kind == "cpu"), None)
    if cpu is not None:
        return cpu.free_bytes
    return mem_available_bytes()


_BUFFER = re.compile(r"(\S+)\s+(model|KV|compute|output|LoRA) buffer size =\s*([0-9.]+) MiB")


def logged_buffers(lines: Iterable[str]) -> list[wire.BufferSize]:
    """The buffers in llama.cpp's load log ("load_tensors: CUDA0 model buffer size =
    1234.56 MiB", "llama_kv_cache: CPU KV buffer size = ..."), summed per buffer and kind."""
    sums: dict[tuple[str, str], float] = {}
    for line in lines:
        m = _BUFFER.search(line)
        if m:
            key = (m.group(1), m.group(2).lower())
            sums[key] = sums.get(key, 0.0) + float(m.group(3))
    return [wire.BufferSize(buffer=b, kind=k, bytes=round(mib * 1024 * 1024)) for (b, k), mib in sums.items()]
