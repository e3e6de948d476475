"""Images inside the continuous batch: the step's side of ``vision.py``.

A prompt with images is a ``VisionTokens`` list: runs of text tokens, which the step's
prompt chunks decode as always (``prefill.py`` stops each run at the next image), and
image spans. For a slot whose prompt reaches an image, ``VisionSteps.step``:

1. has the image encoded on the encoder thread (one thread, one image at a time; the
   vision tower runs there while the engine thread goes on decoding every other slot,
   so an encode never stalls the streams beside it). A slot waits at its image until
   the embeddings are there; every upcoming image of a running prompt is queued at once.
2. decodes the embeddings into the slot's sequence, one piece of at most
   ``min(n_batch, n_ubatch)`` positions per step, in a llama_decode of its own
   (a llama_batch carries tokens or embeddings, not both) just before the step's
   batch of tokens; Gemma 3's image positions attend to one another (non-causal), so
   causal attention is off for that decode only.

Prefix reuse: the image positions' pseudo-ids come from the pixels' hash, so the same
picture in the next turn matches the slot's cache and is neither encoded nor decoded
again; ``snap`` cuts a match that ends inside an image back to the image's start.
An encode or decode that fails fails that request only (``RequestFailed(internal)``).
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import time
from collections.abc import Callable, Iterator

import llama_cpp as ll
import msgspec
import numpy as np

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.model import LoadedModel
from corral.worker import vision_mrope as mrope
from corral.worker.slots import Job, Slot
from corral.worker.vision import ImageSpan, Projector, VisionTokens, load_projector

__all__ = ["EmbdBatch", "VisionSteps"]

FailSlot = Callable[[Slot, Job, str], None]
# While other slots generate, images (encodes and pieces) get about this share of the
# engine's time: after image work of d seconds the others run (1/share - 1) * d seconds
# of plain steps first. Alone, an image goes at full speed.
IMAGE_SHARE = 0.15


class EmbdBatch:
    """A llama_batch of embeddings over buffers we own (one sequence per piece)."""

    def __init__(self, n: int, n_embd: int, n_pos: int = 1) -> None:
        self.cap = n
        self.n_embd = n_embd
        self.embd = np.zeros(n * n_embd, dtype=np.float32)
        self.pos = (ll.llama_pos * (n * n_pos))()  # M-RoPE: 4 an embedding, section-major
        self.n_seq_id = (ctypes.c_int32 * n)(*([1] * n))
        self.seq = (ll.llama_seq_id * n)()
        self.seq_ptr = (ctypes.POINTER(ll.llama_seq_id) * n)()
        base, size = ctypes.addressof(self.seq), ctypes.sizeof(ll.llama_seq_id)
        for i in range(n):
            self.seq_ptr[i] = ctypes.cast(base + i * size, ctypes.POINTER(ll.llama_seq_id))
        self.logits = (ctypes.c_int8 * n)()
        self.batch = ll.llama_batch(
            token=None, embd=self.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos=ctypes.cast(self.pos, ctypes.POINTER(ll.llama_pos)),
            n_seq_id=ctypes.cast(self.n_seq_id, ctypes.POINTER(ctypes.c_int32)),
            seq_id=ctypes.cast(self.seq_ptr, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id))),
            logits=ctypes.cast(self.logits, ctypes.POINTER(ctypes.c_int8)))


class VisionSteps:
    """The engine's images: the projector (or none) and the encodes and pieces of each step."""

    def __init__(self, projector: Projector | None, m: LoadedModel, model_id: str) -> None:
        self.proj = projector
        self.mrope = projector is not None and projector.mrope  # M-RoPE positions (vision_mrope.py)
        self.m = m
        self.model_id = model_id
        self.piece = max(1, min(m.n_batch, ll.llama_n_ubatch(m.ctx)))
        self._batch: EmbdBatch | None = None
        self._encoder: cf.ThreadPoolExecutor | None = None
        self._pending: dict[ImageSpan, tuple[cf.Future[tuple[np.ndarray, float]], Job]] = {}
        self.pieces = 0  # image pieces decoded (one per step at most)
        self.share = IMAGE_SHARE
        self._debt = 0.0  # seconds of plain steps the other streams are owed before the next image work
        self._last_step = 0.0

    @classmethod
    def load(cls, s: wire.WorkerSettings, m: LoadedModel) -> VisionSteps:
        return cls(load_projector(s, m), m, s.model_id)

    def model_info(self, info: wire.ModelInfo) -> wire.ModelInfo:
        if self.proj is None:
            return info
        return msgspec.structs.replace(info, vision=True, mmproj_bytes=self.proj.nbytes)

    @property
    def encodes(self) -> int:
        return self.proj.encodes if self.proj is not None else 0

    # ------------------------------------------------------------------ preparing (any thread)

    def tokenize(self, text: str, images: list[bytes], *, add_special: bool) -> VisionTokens:
        if self.proj is None:
            raise RequestRejected("invalid_request", f"model {self.model_id} does not take images: it has no "
                                                     "multimodal projector (set mmproj for it)")
        return self.proj.tokenize(text, images, add_special=add_special)

    kv_pos = staticmethod(mrope.kv_pos)  # a slot's KV position after M-RoPE images (vision_mrope.py)
    speculation_allowed = staticmethod(mrope.speculation_allowed)

    @staticmethod
    def snap(tokens: list[int], reuse: int) -> int:
        """``reuse`` cut back to the start of an image it would end inside."""
        return tokens.snap(reuse) if isinstance(tokens, VisionTokens) else reuse

    # ------------------------------------------------------------------ the step (engine thread)

    def step(self, slots: list[Slot], fail: FailSlot) -> None:
        """Start the encodes the slots' prompts need, collect finished ones, and decode one
        image piece (before the step's batch of tokens)."""
        if self.proj is None or not (self._pending or any(_vision_job(s) for s in slots)):
            return
        now = time.perf_counter()
        others = any(s.job is not None and _vision_job(s) is None for s in slots)
        self._debt = max(0.0, self._debt - (now - self._last_step)) if others else 0.0
        self._last_step = now
        self._collect(slots, fail, others)
        if self._debt > 0:
            return  # the other streams' turn
        for slot, job, toks in _vision_slots(slots):
            for span in toks.images:
                if span.end > slot.prompt_pos and span.embd is None and span not in self._pending:
                    self._encode_later(span, job)
                    if others:
                        break  # one at a time while others stream (each encode is owed for)
        for slot, job, toks in _vision_slots(slots):
            at = toks.span_at(slot.prompt_pos)
            if at is not None and at.embd is not None:
                t0 = time.perf_counter()
                self._decode_piece(slot, job, at, fail)
                self._owe(time.perf_counter() - t0, others)
                return

    def wait(self, timeout: float = 0.5) -> None:
        """Nothing else to decode this step: wait for an encode instead of spinning."""
        if self._pending:
            cf.wait([f for f, _ in self._pending.values()], timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def close(self) -> None:
        if self._encoder is not None:
            for fut, _ in self._pending.values():
                fut.cancel()
            self._encoder.shutdown(wait=True)
            self._encoder = None
        self._pending.clear()
        if self.proj is not None:
            self.proj.free()

    def _owe(self, seconds: float, others: bool) -> None:
        if others:
            self._debt += seconds * (1 / self.share - 1)

    def _encode_later(self, span: ImageSpan, job: Job) -> None:
        assert self.proj is not None
        if self._encoder is None:
            self._encoder = cf.ThreadPoolExecutor(1, thread_name_prefix="corral-vision")
        self._pending[span] = (self._encoder.submit(_timed, self.proj.encode, span), job)

    def _collect(self, slots: list[Slot], fail: FailSlot, others: bool) -> None:
        running = {id(s.job): s for s in slots if s.job is not None}
        for span, (fut, job) in list(self._pending.items()):
            slot = running.get(id(job))
            if slot is None or slot.job is not job:  # the request ended (aborted, failed)
                fut.cancel()
                if fut.done() or fut.cancelled():
                    del self._pending[span]
                continue
            if not fut.done():
                continue
            del self._pending[span]
            exc = fut.exception()
            if exc is not None:
                fail(slot, job, f"{type(exc).__name__}: {exc}")
            else:
                span.embd, seconds = fut.result()
                self._owe(seconds, others)

    def _decode_piece(self, slot: Slot, job: Job, span: ImageSpan, fail: FailSlot) -> None:
        assert span.embd is not None
        if self._batch is None:
            self._batch = EmbdBatch(self.piece, span.embd.shape[1], mrope.N_POS_PER_EMBD if self.mrope else 1)
        b = self._batch
        off = slot.prompt_pos - span.start
        k = min(self.piece, span.n_tokens - off)
        b.embd[: k * b.n_embd] = span.embd[off: off + k].ravel()
        if self.mrope:  # t, y, x from the image's first position (vision_mrope.py)
            mrope.write_positions(b.pos, span, mrope.kv_pos(job.tokens, span.start), off, k)
        else:
            b.pos[:k] = list(range(len(slot.cached), len(slot.cached) + k))
        for i in range(k):
            b.seq[i] = slot.index
            b.logits[i] = 0
        b.batch.n_tokens = k
        if span.non_causal:
            ll.llama_set_causal_attn(self.m.ctx, False)
        try:
            rc = ll.llama_decode(self.m.ctx, b.batch)
        finally:
            if span.non_causal:
                ll.llama_set_causal_attn(self.m.ctx, True)
        if rc != 0:
            fail(slot, job, f"decode of an image failed: llama_decode returned {rc}")
            return
        self.pieces += 1
        slot.cached.extend(job.tokens[slot.prompt_pos: slot.prompt_pos + k])
        slot.prompt_pos += k
        if slot.prompt_pos == span.end:
            span.embd = None  # decoded: the floats are not needed again


def _timed(encode: Callable[[ImageSpan], np.ndarray], span: ImageSpan) -> tuple[np.ndarray, float]:
    t0 = time.perf_counter()
    return encode(span), time.perf_counter() - t0


def _vision_slots(slots: list[Slot]) -> Iterator[tuple[Slot, Job, VisionTokens]]:
    """The slots whose prompt with images is still being prefilled, with the job and its tokens."""
    for slot in slots:
        job = _vision_job(slot)
        if job is not None:
            assert isinstance(job.tokens, VisionTokens)
            yield slot, job, job.tokens


def _vision_job(slot: Slot) -> Job | None:
    """The slot's job while its prompt with images is still being prefilled."""
    job = slot.job
    if job is None or slot.n_gen > 0 or not isinstance(job.tokens, VisionTokens) or not job.tokens.images:
        return None
    return job if slot.prompt_pos < job.tokens.images[-1].end else None
