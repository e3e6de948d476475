"""llama.cpp's backend and log, and opening a context on loaded weights: one way for the
worker's four contexts (the model's, the embeddings', the images' side context, a draft
model's).

    p = context_params(settings, n_ctx=..., n_batch=..., n_ubatch=..., n_seq_max=..., threads=...)
    ctx, buffers = open_context(model, p)   # ContextFailed(llama.cpp's log tail) when it cannot

``buffers`` are the buffers llama.cpp logged creating that context ("CPU KV buffer size =
...", "CUDA0 compute buffer size = ...": ``devices.logged_buffers``), counted from the lines
logged during that call only. ``with captured() as lines:`` collects every line llama.cpp or
libmtmd logs inside the block (a draft's, a LoRA adapter's, a projector's load: where they went). The log callback (``init_backend``) keeps warnings and errors
(``log_lines``) and every buffer line (``buffer_lines``: the model's load reports its weights'
and its context's from them); ``aborting`` silences the error lines of a decode aborted on
purpose (worker/preempt/urgent.py).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.host.devices import ggml_amx, logged_buffers

__all__ = ["GGML_TYPES", "ContextFailed", "aborting", "buffer_lines", "captured", "context_params", "init_backend",
           "log_callback", "log_lines", "model_params", "open_context"]

# ggml's enum ggml_type for the KV cache types (corral.model.settings.KV_CACHE_TYPES)
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}

log = logging.getLogger("corral.worker.llama_context")
_backend_lock = threading.Lock()
_backend_ready = False
log_lines: collections.deque[str] = collections.deque(maxlen=20)
buffer_lines: collections.deque[str] = collections.deque(maxlen=64)  # llama.cpp's "... buffer size = X MiB"
_captures: list[list[str]] = []  # the lines logged inside ``captured`` blocks
_log_verbose = False
aborting = [False]  # True while a decode may be aborted on purpose (worker/preempt/urgent.py): its error lines are not errors
_ABORT_LINES = ("failed with error 1", "compute status: 1", "ret = 2")  # GGML_STATUS_ABORTED, llama_decode's 2


class ContextFailed(Exception):
    """llama.cpp could not create the context; ``str(exc)`` is its log's tail."""


def _log_message(level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
    if not text:
        return
    line = text.decode("utf-8", "replace")
    for lines in _captures:
        lines.append(line.rstrip())
    # ggml levels: 1 debug, 2 info, 3 warn, 4 error, 5 cont
    if level in (3, 4):
        log_lines.append(line.rstrip())
    elif "buffer size =" in line:
        buffer_lines.append(line.rstrip())
    if level == 4 and aborting[0] and line.rstrip().endswith(_ABORT_LINES):
        return  # a decode aborted on purpose (worker/preempt/urgent.py), not an error
    if _log_verbose or level == 4:
        sys.stderr.write(line)


log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_log_message)


def init_backend(verbose: bool) -> None:
    global _backend_ready, _log_verbose
    with _backend_lock:
        _log_verbose = verbose
        if _backend_ready:
            return
        ll.llama_log_set(log_callback, ctypes.c_void_p(0))
        ll.llama_backend_init()
        _backend_ready = True


def model_params(n_gpu_layers: int) -> Any:
    """``llama_model_params`` for a load (the model's, a draft's): ``n_gpu_layers`` layers on
    the GPUs; where ggml's AMX buffer would take the weights (``devices.ggml_amx``: its matrix
    product crashes) without llama.cpp's extra buffer types, as llama-server's ``--no-repack``."""
    p = ll.llama_model_default_params()
    p.n_gpu_layers = n_gpu_layers
    if ggml_amx():
        p.use_extra_bufts = False
        log.info("weights in plain CPU buffers: ggml's AMX matrix product crashes (llama.cpp issue 20824)")
    return p


def flash_attn_type(s: wire.WorkerSettings) -> int:
    """llama.cpp's flash attention type for ``s.flash_attn``: on, off, or auto where unset (the
    model's context, its draft's and its projector's, as llama-server's ``-fa`` sets them all)."""
    if s.flash_attn is None:
        return int(ll.LLAMA_FLASH_ATTN_TYPE_AUTO)
    return int(ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if s.flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED)


def context_params(s: wire.WorkerSettings, *, n_ctx: int, n_batch: int, n_ubatch: int, n_seq_max: int,
                   threads: int, threads_batch: int | None = None, **more: Any) -> Any:
    """``llama_context_params`` for a context of ``s``'s model: the sizes given, the KV cache
    types of ``s``, no perf counters, ``s.flash_attn``, and any other field in ``more``
    (``embeddings=True``, ...)."""
    p = ll.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, n_batch, n_ubatch, n_seq_max
    p.n_threads = threads
    p.n_threads_batch = threads if threads_batch is None else threads_batch
    p.no_perf = True
    p.type_k, p.type_v = GGML_TYPES[s.cache_type_k], GGML_TYPES[s.cache_type_v]
    p.flash_attn_type = flash_attn_type(s)
    for name, value in more.items():
        setattr(p, name, value)
    return p


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """The lines logged (any level) while the block runs (the log callback must be set:
    ``init_backend``, and for libmtmd ``mtmd_helper_log_set(log_callback)``)."""
    lines: list[str] = []
    _captures.append(lines)
    try:
        yield lines
    finally:
        _captures.remove(lines)


def open_context(model: ll.llama_model_p, p: Any) -> tuple[ll.llama_context_p, list[wire.BufferSize]]:
    """A context on ``model``'s weights with params ``p``, and the buffers it allocated (as
    llama.cpp logged them while creating it); ``ContextFailed`` when it cannot be created."""
    with captured() as lines:
        ctx: ll.llama_context_p = ll.llama_init_from_model(model, p)
    if not ctx:
        raise ContextFailed("; ".join(line for line in log_lines if line)[-500:])
    return ctx, logged_buffers(lines)
