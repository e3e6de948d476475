"""Image work beside other streams: two image threads and a side context.

An image costs an encode (the vision tower) and a decode of its embeddings into the slot's
sequence (Gemma 3: one non-causal batch of all its positions, which cannot be split
without changing its KV). Done on the engine's thread, the decode stalls every other slot
for its whole length (256 positions: about a second on two cores); done at normal priority
on another thread, it fights the decode threads for the cores (ggml's threads spin at a
barrier after every graph node, so a step with a thread short of a core gets many times
slower). So:

- ``ImageThreads``: where image work runs. Alone (no other slot generating) it runs on the
  engine's thread itself, as llama-server encodes on its one loop thread: the engine has
  nothing else to decode meanwhile, and its OpenMP team computes the graphs. Beside other
  streams it runs on one niced thread, ``beside``: nice ``BESIDE_NICE`` and the
  ``SCHED_IDLE`` policy, set before its first ggml call, so the OpenMP threads it starts
  for its graphs (libgomp keeps one team per calling thread; a new thread inherits its
  creator's nice and policy) are too, and the engine's decode threads win every core
  they want. Nice 19 alone was not enough: it still takes a core now and then from a
  decode thread, whose partners then spin at ggml's barrier (streams beside images
  0.72-0.76x of their rate alone on an AMD EPYC with 2 cores; 0.87-1.00x with
  ``SCHED_IDLE``, bench/checks/vision.py). No priority is ever raised again (an
  unprivileged thread cannot lower a nice value or leave ``SCHED_IDLE``). The thread names
  itself (``comm``), and its OpenMP threads inherit the name: ``thread_nice`` reads them
  back.
  After each job the beside thread gives its OpenMP team back (``omp_pause_resource_all``).
  libgomp counts every team's threads, and while they outnumber the CPUs it spins at most
  100 times at a barrier before it sleeps in a futex (its "throttled" spin count), in
  every team: a second team left alive made each of the engine's decodes sleep and wake
  at hundreds of barriers (3,800 voluntary context switches for 8 image requests, against
  llama-server's 20; 64 with the encode on the engine's thread, and image to first token
  from 0.83-0.88x to ahead of llama-server's). For the same reason the side context
  decodes on one thread (no team at all): with two, every decode step of the streams
  beside it took 15% longer, with one 8% (the niced thread's leftover cores); the
  encode beside streams still starts a team (libmtmd's thread count is fixed at load),
  for the encode only.
- ``SideContext``: a second llama.cpp context on the same weights (one sequence of one
  slot's length, one micro-batch of the image piece's size, the model context's cache
  types; created on the first image beside other streams, its KV and compute buffers
  counted in ``Stats.kv_bytes`` from then on). While other slots generate, an image is decoded there on the ``beside``
  thread: the slot's KV up to the image is copied in (``kv_store.save_seq``), the image's
  pieces decoded exactly as the engine would (same pieces, same positions), and the
  sequence copied back into the slot when the engine next steps. The streams go on
  meanwhile; the image gets the cores they leave, and ``MediaSteps`` gives it a share
  of each step's time (it waits for it, ``IMAGE_SHARE``) so it is never starved.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import ctypes.util
import functools
import os
import struct
import threading
from collections.abc import Callable
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.llama_context import ContextFailed, context_params, open_context
from corral.worker.cache.kv_store import restore_seq, save_seq
from corral.worker.model import LoadedModel

__all__ = ["BESIDE_NICE", "BESIDE_THREAD", "INTAKE_THREAD", "ImageThreads", "SideContext", "SideUnsupported", "restream",
           "start_thread", "thread_nice"]

BESIDE_NICE = 19  # the beside thread's nice: below every normal-priority thread
BESIDE_THREAD = "corral-img-bg"  # the beside thread's comm (at most 15 bytes)
INTAKE_THREAD = "corral-media-in"  # the thread that prepares requests with media (media/steps.py)
_PR_SET_NAME = 15


def _name_thread(name: str) -> None:
    """This OS thread's ``comm`` (the threads it creates inherit it)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the names only serve thread_nice


def start_thread(name: str, nice: int) -> None:
    _name_thread(name)
    if nice > 0 and hasattr(os, "setpriority"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
        except OSError:
            pass  # the thread keeps the process's priority; the time share still holds
        if hasattr(os, "SCHED_IDLE"):
            try:  # runs only on a core nothing else wants (an unprivileged thread may lower itself to it)
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            except OSError:
                pass


def thread_nice() -> dict[str, list[int]]:
    """The nice value of each of this process's threads by name (``comm``), from /proc."""
    out: dict[str, list[int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index(b"(") + 1: stat.rindex(b")")].decode(errors="replace")
        rest = stat[stat.rindex(b")") + 2:].split()
        out.setdefault(name, []).append(int(rest[16]))  # field 19: nice
    return out


def restream(state: bytes, n_stream: int) -> bytes | None:
    """A sequence's KV state (``llama_state_seq_get_data``) rewritten for a cache of
    ``n_stream`` streams: after an 8-byte header, each cache's block (two with sliding-window layers) lists every
    stream with its cell count, only the sequence's own being non-empty, and llama.cpp
    reads that one into the destination sequence's stream whatever its index. None when
    the bytes do not parse exactly as that layout (the caller keeps the image on the
    engine's thread)."""
    for ext in (0, 12):  # 12: cells with an llama_kv_cell_ext (M-RoPE's 2-D position, a token id)
        try:
            out = _restream(state, n_stream, ext)
        except (struct.error, ValueError):
            continue
        if out is not None:
            return out
    return None


def _restream(state: bytes, n_stream: int, ext: int) -> bytes | None:
    out, i = bytearray(state[:8]), 8  # the magic and the sequence id it was saved from
    while i < len(state):
        (n,) = struct.unpack_from("<I", state, i)
        i += 4
        payloads = []
        for _ in range(n):
            (count,) = struct.unpack_from("<I", state, i)
            start, i = i, i + 4
            if count == 0:
                continue
            for _ in range(count):  # pos, n_seq_id, [ext], seq ids
                (nseq,) = struct.unpack_from("<I", state, i + 4)
                i += 8 + ext + 4 * nseq
            v_trans, n_layer = struct.unpack_from("<II", state, i)
            if v_trans > 1 or n_layer > 4096:
                return None
            i += 8
            for _ in range(n_layer):  # K rows: type, row size, rows
                _, row = struct.unpack_from("<iQ", state, i)
                i += 12 + count * row
            for _ in range(n_layer):  # V: rows, or (transposed) element size, width, columns
                if v_trans:
                    _, el, width = struct.unpack_from("<iII", state, i)
                    i += 12 + width * count * el
                else:
                    _, row = struct.unpack_from("<iQ", state, i)
                    i += 12 + count * row
            payloads.append(state[start:i])
        if len(payloads) > 1 or i > len(state):
            return None
        out += struct.pack("<I", n_stream) + (payloads[0] if payloads else b"\0\0\0\0")
        out += b"\0\0\0\0" * (n_stream - 1)
    return bytes(out)


class SideUnsupported(RuntimeError):
    """The slot's KV state is not in a layout ``restream`` knows, or the side context could not
    be created (no room for it): images go on the engine's thread from then on."""


def _release_omp_team() -> None:
    """This thread's OpenMP team back to libgomp (the threads end), where libgomp is loaded."""
    pause = _gomp_pause()
    if pause is not None:
        pause(1)  # omp_pause_soft: frees the calling thread's pool


@functools.cache
def _gomp_pause() -> Callable[[int], int] | None:
    try:  # the libgomp llama.cpp's CPU backend already loaded; none without OpenMP
        lib = ctypes.CDLL("libgomp.so.1", mode=getattr(os, "RTLD_NOLOAD", 0))
        fn = lib.omp_pause_resource_all
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
    return fn


class ImageThreads:
    """Image work: alone on the calling (engine) thread, beside other streams on the niced
    ``beside`` thread (started on first use), whose OpenMP team ends after each job."""

    def __init__(self) -> None:
        self._pool: cf.ThreadPoolExecutor | None = None
        self.submitted = {False: 0, True: 0}  # jobs run alone / beside other streams

    def submit(self, beside: bool, fn: Callable[..., Any], *args: Any) -> cf.Future[Any]:
        self.submitted[beside] += 1
        if not beside:
            fut: cf.Future[Any] = cf.Future()
            try:
                fut.set_result(fn(*args))
            except Exception as exc:  # noqa: BLE001 - the caller fails that request only
                fut.set_exception(exc)
            return fut
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix=BESIDE_THREAD, initializer=start_thread,
                                               initargs=(BESIDE_THREAD, BESIDE_NICE))
        return self._pool.submit(_then_release, fn, *args)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _then_release(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    finally:
        _release_omp_team()


class SideContext:
    """A one-sequence context on the model's weights for decoding an image off the engine's
    thread (the ``beside`` thread only). Created on first use; freed with the model."""

    def __init__(self, m: LoadedModel, s: wire.WorkerSettings, piece: int) -> None:
        self.m, self.s, self.piece = m, s, piece
        self.ctx: ll.llama_context_p | None = None
        self.usable = True  # False after a SideUnsupported: images stay on the engine's thread
        self.kv_bytes = 0  # its KV cache and compute buffers, once created (counted in Stats.kv_bytes)
        self.compute_bytes = 0  # of which its compute buffers
        self._lock = threading.Lock()

    def _open(self) -> ll.llama_context_p:
        s, m = self.s, self.m
        # n_outputs_max 1: it never draws, no logits room for a whole micro-batch (Gemma 3: 512 MiB
        # of 560); one thread: no OpenMP team of its own beside the engine's, whose barriers libgomp
        # would throttle for the whole decode (see the module docstring)
        p = context_params(s, n_ctx=m.n_ctx_slot, n_batch=self.piece, n_ubatch=self.piece, n_seq_max=1,
                           threads=1, n_outputs_max=1, swa_full=False)
        try:
            ctx, bufs = open_context(m.model, p)
        except ContextFailed as exc:
            raise RuntimeError(f"llama.cpp could not create a side context of {m.n_ctx_slot} cells for images: "
                               f"{exc}") from None
        m.extra_contexts.append(ctx)  # freed with the model
        self.kv_bytes = sum(b.bytes for b in bufs if b.kind in ("kv", "compute"))
        self.compute_bytes = sum(b.bytes for b in bufs if b.kind == "compute")
        return ctx

    def run(self, state: bytes, work: Callable[[ll.llama_context_p], None], n_stream: int) -> bytes:
        """The sequence ``state`` (from the model's context, ``n_stream`` KV streams) copied in
        as sequence 0, ``work(ctx)`` (the image's pieces), and the sequence's new state, for
        the model's context; the side context is left empty."""
        with self._lock:
            if self.ctx is None:
                try:
                    self.ctx = self._open()
                except RuntimeError as exc:  # no room for it (a GPU that is full): the engine's thread decodes
                    raise SideUnsupported(str(exc)) from None
            mem = ll.llama_get_memory(self.ctx)
            ll.llama_memory_seq_rm(mem, 0, -1, -1)
            try:
                one = restream(state, 1) if state else b""
                if one is None:
                    raise SideUnsupported("the slot's KV state is not in a layout the image context reads")
                if one and not restore_seq(self.ctx, 0, one):
                    raise RuntimeError("the slot's KV could not be copied into the image context")
                work(self.ctx)
                back = restream(save_seq(self.ctx, 0), n_stream)
                if back is None:
                    raise SideUnsupported("the image context's KV state is not in a layout restream knows")
                return back
            finally:
                ll.llama_memory_seq_rm(mem, 0, -1, -1)
