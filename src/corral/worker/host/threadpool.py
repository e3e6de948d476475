"""A persistent ggml threadpool for the model's context, as llama-server attaches one.

Without one, every graph computes on a threadpool ggml makes and frees for it; llama-server
(``common_init``: "llama threadpool init") attaches one for the context's life, polling
level 50. Measured in-process on the bench's vision settings (docs/benchmarks.md): a
256-position image decode 10% faster with it (380 against 420 ms), generation steps the
same. With OpenMP the pool's work still runs in the calling thread's team, so the engine's
thread computes as before; the side context (media/side.py), which computes on another
thread at the same time, keeps ggml's own. ``set_threads`` may go no higher than the pool's
threads (ggml caps a graph at them).

The bindings have no ``ggml_threadpool_*``: they are loaded from llama-cpp-python's
libraries by ctypes; where that fails the context computes as before (``attach`` gives None).
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp as ll

from corral.worker.host.devices import llama_cpp_lib

__all__ = ["POLL", "ThreadPool", "attach"]

log = logging.getLogger(__name__)

POLL = 50  # llama-server's default polling level (0: none, 100: aggressive)
_MAX_THREADS = 512  # GGML_MAX_N_THREADS


class _Params(ctypes.Structure):
    _fields_ = [("cpumask", ctypes.c_bool * _MAX_THREADS), ("n_threads", ctypes.c_int), ("prio", ctypes.c_int),
                ("poll", ctypes.c_uint32), ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


class ThreadPool:
    def __init__(self, lib: ctypes.CDLL, pool: int) -> None:
        self._lib, self.pool = lib, pool

    def free(self) -> None:
        """After the context it was attached to is freed."""
        if self.pool:
            self._lib.ggml_threadpool_free(ctypes.c_void_p(self.pool))
            self.pool = 0


def attach(ctx: ll.llama_context_p, n_threads: int) -> ThreadPool | None:
    """A pool of ``n_threads`` attached to ``ctx`` for its decodes and batches; None where the
    libraries do not offer one."""
    base, cpu, llama = llama_cpp_lib("ggml-base"), llama_cpp_lib("ggml-cpu"), llama_cpp_lib("llama")
    if base is None or cpu is None or llama is None:
        log.info("no persistent threadpool (llama-cpp-python's libraries not found): ggml's own per graph")
        return None
    try:
        default = getattr(base, "ggml_threadpool_params_default", None) or cpu.ggml_threadpool_params_default
        default.restype, default.argtypes = _Params, [ctypes.c_int]
        cpu.ggml_threadpool_new.restype, cpu.ggml_threadpool_new.argtypes = ctypes.c_void_p, [ctypes.POINTER(_Params)]
        cpu.ggml_threadpool_free.restype, cpu.ggml_threadpool_free.argtypes = None, [ctypes.c_void_p]
        llama.llama_attach_threadpool.restype = None
        llama.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    except AttributeError as exc:  # a build without them
        log.info("no persistent threadpool (%s): ggml's own per graph", exc)
        return None
    params = default(max(1, n_threads))
    params.poll = POLL
    pool = cpu.ggml_threadpool_new(ctypes.byref(params))
    if not pool:
        return None
    llama.llama_attach_threadpool(ctx, pool, pool)
    return ThreadPool(cpu, pool)
