"""Sampling the slots of one step on several threads (``ModelSettings.sampling_threads``).

After a step's ``llama_decode`` every slot with logits draws its next token. The draw is
C work (``llama_sampler_sample`` over the whole vocabulary: ~0.3 ms per slot with Gemma's
262k tokens) or numpy over the logits (grammar resampling, logprobs); ctypes and numpy
release the GIL for it. On a GPU the decode of a batch takes a few ms, so at 32 slots the
draws, one after another, would take longer than the decode. ``SamplePool.map`` runs them
side by side: the engine thread and ``n - 1`` pool threads each take the next slot from
one shared list until none is left.

What keeps it sound:

- One slot, one thread: a slot appears once in a step's list and the thread that takes it
  runs all of that slot's draw (its sampler chain, grammar, RNG, buffers); ``map`` returns
  only when every draw has ended. Each slot's RNG is its own (``dist(seed)``), so a draw
  does not depend on which thread ran it or when: the tokens are those of sequential
  sampling.
- The shared context is only read: ``presync`` (``llama_get_logits`` on the engine
  thread) first waits for the decode and applies llama.cpp's output reordering; after it,
  the ``llama_get_logits_ith`` inside each draw only finds nothing left to do.
- Everything after the draw stays on the engine thread, slot by slot in batch order
  (the engine's ``_take``): counters, end-of-generation, pieces -> UTF-8 -> stop strings ->
  tool calls -> ``Delta``, finishing. So the messages and their order are those of
  sequential sampling.
- A draw that raises fails only its slot: the exception is returned with the draw's
  result and the engine answers that request ``RequestFailed``; the others go on.

Overlapping the draws with the NEXT decode is not possible: that decode needs the tokens
of every generating slot, and it overwrites the logits buffer the draws read.

Threads and the governor (worker/host/cpu.py): draws run only between decodes, while ggml's
decode threads wait, so they use the same cores in turns. ``cap`` is set from the
governor's count of cores other processes leave free (``ThreadGovernor.free_cores``), so a
step never runs more draws at once than there are free cores.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, TypeVar, cast

import llama_cpp as ll

from corral import wire
from corral.worker.sampling import sampler as sampling
from corral.worker.host.devices import gpu_devices

__all__ = ["SamplePool", "Drawn", "draw", "presync", "pool_for", "resolve_sampling_threads", "AUTO_CPU_MAX",
           "AUTO_GPU_MAX"]

# "auto" with no layers on a GPU: min(n_parallel, CPUs, this). On 2 quiet cores, c=8, two
# threads gave 1.02x tok/s (1.01-1.05x in all 6 interleaved rounds): while a step samples,
# the decode threads are idle, so the draws have the cores to themselves.
AUTO_CPU_MAX = 4
AUTO_GPU_MAX = 8  # "auto" with GPU layers: min(n_parallel, CPUs, this)

T = TypeVar("T")
R = TypeVar("R")


def resolve_sampling_threads(setting: int | Literal["auto"], *, offloaded: bool, n_parallel: int,
                             n_cpus: int) -> int:
    """The pool's size: a number as given (at most one per slot), or "auto"."""
    if setting != "auto":
        return max(1, min(setting, n_parallel))
    return max(1, min(n_parallel, n_cpus, AUTO_GPU_MAX if offloaded else AUTO_CPU_MAX))


def pool_for(setting: int | Literal["auto"], info: wire.ModelInfo) -> "SamplePool":
    """The pool for a loaded model: "auto" counts as offloaded when layers went to a GPU
    this worker sees (``n_gpu_layers = 999`` on a machine without one is the CPU case)."""
    offloaded = info.gpu_layers != 0 and bool(gpu_devices(info.devices))
    n_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return SamplePool(resolve_sampling_threads(setting, offloaded=offloaded, n_parallel=info.n_slots,
                                               n_cpus=n_cpus))


@dataclass
class Drawn:
    """One slot's draw: the token (None: a grammar allows nothing more), its logprobs if
    the request asked, or the exception that ended the draw."""

    token: int | None = None
    logprob: wire.TokenLogprob | None = None
    error: BaseException | None = None


def draw(sampler: sampling.Sampler | None, ctx: ll.llama_context_p, idx: int, *, is_eog: Callable[[int], bool],
         ends_on_eog: bool, logprobs: int | None, n_vocab: int, piece: Callable[[int], bytes]) -> Drawn:
    """Sample one slot at batch position ``idx`` (and its logprobs, unless the token ends
    the request); thread-safe for distinct samplers. Never raises: errors are returned."""
    try:
        if sampler is None:
            raise RuntimeError("the slot has no sampler")
        tok = sampler.sample(ctx, idx, is_eog)
        lp = None
        if logprobs is not None and tok is not None and not (ends_on_eog and is_eog(tok)):
            lp = sampling.token_logprobs(sampling.logits_at(ctx, idx, n_vocab), tok, logprobs, piece)
        return Drawn(tok, lp)
    except Exception as exc:  # noqa: BLE001 - the engine fails this request only
        return Drawn(error=exc)


def presync(ctx: ll.llama_context_p) -> None:
    """Wait for the decode and settle llama.cpp's output order, on the engine thread."""
    ll.llama_get_logits(ctx)


class SamplePool:
    """``n`` threads in all: the caller's and ``n - 1`` pool threads (started lazily)."""

    def __init__(self, n: int) -> None:
        self.n = max(1, n)
        self.cap = self.n  # at most this many at once (the governor's free cores)
        self._pool: ThreadPoolExecutor | None = None

    def width(self, n_items: int) -> int:
        """Threads a step of ``n_items`` draws would use."""
        return max(1, min(self.n, self.cap, n_items))

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(x) for x in items]``, run on up to ``width`` threads; ``fn`` must not raise
        (a pool thread's exception is re-raised here)."""
        width = self.width(len(items))
        if width == 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.n - 1, thread_name_prefix="corral-sample")
        results: list[R | None] = [None] * len(items)
        order = iter(range(len(items)))
        lock = threading.Lock()

        def drain() -> None:
            while True:
                with lock:
                    i = next(order, -1)
                if i < 0:
                    return
                results[i] = fn(items[i])

        futures: list[Future[None]] = [self._pool.submit(drain) for _ in range(width - 1)]
        drain()
        for f in futures:
            f.result()
        return cast("list[R]", results)  # every index was filled: the futures all ended

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
