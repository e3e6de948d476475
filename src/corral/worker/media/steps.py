"""Media inside the continuous batch: the step's side of the media room. What follows says
"image"; every chunk kind (media/prompt.py) goes the same way: its encode, its embeddings.

A prompt with images is a ``MediaPrompt`` (media/prompt.py): runs of text tokens, which the
step's prompt chunks decode as always (``prefill.py`` stops each run at the next chunk:
``media.prompt.text_end``), and chunks. For a slot whose prompt reaches an image,
``MediaSteps.step``:

1. has the image encoded (``media.side.ImageThreads``): alone on the engine's thread, as
   llama-server does (nothing else is generating; a second OpenMP team would make every
   team's barriers sleep, media/side.py); beside other streams on the niced image thread,
   one image at a time, while the engine thread goes on decoding every other slot. A slot
   waits at its image until the embeddings are there.
2. alone (no other slot generating): decodes the embeddings into the slot's sequence,
   one piece of at most ``min(n_batch, n_ubatch)`` positions per step, in a llama_decode
   of its own (a llama_batch carries tokens or embeddings, not both) just before the
   step's batch of tokens; Gemma 3's image positions attend to one another
   (non-causal), so causal attention is off for that decode only.
3. beside other streams: the encode and the same pieces run on the niced image thread,
   in the side context (``media.side.SideContext``: the slot's KV copied in, the image
   decoded, the KV copied back into the slot in a later step), and the engine waits for
   that work ``IMAGE_SHARE`` of each step's time. A non-causal image is one decode of
   all its positions (it cannot be split without changing its KV), so on the engine's
   thread it would stall every stream for its whole length.

Prefix reuse: the image positions' pseudo-ids come from the pixels' hash, so the same
picture in the next turn matches the slot's cache and is neither encoded nor decoded
again; ``media.prompt.reuse_cut`` cuts a match that ends inside an image back to its start.
An encode or decode that fails fails that request only (``RequestFailed(internal)``).

As a step feature (``StepFeature``, worker/slots.py; listed only when the model has a
projector): ``before_batch`` is ``step`` (it narrows nothing), ``idle`` is ``wait``.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import llama_cpp as ll
import msgspec
import numpy as np

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.cache.kv_store import restore_seq, save_seq
from corral.worker.model import LoadedModel
from corral.worker.media import mrope
from corral.worker.slots import Job, Slot, StepFeature
from corral.worker.media.projector import Projector, load_projector
from corral.worker.media.prompt import MediaChunk, MediaPrompt, kv_pos
from corral.worker.media.side import BESIDE_NICE, INTAKE_THREAD, ImageThreads, SideContext, SideUnsupported, start_thread

__all__ = ["EmbdBatch", "MediaSteps", "decode_embd"]

log = logging.getLogger("corral.worker.media.steps")
FailSlot = Callable[[Slot, Job, str], None]
# While other slots generate, image work (on the niced image thread, media/side.py) gets at
# least this share of the time: the engine waits for it share / (1 - share) of each step.
# Alone, an image goes at full speed.
IMAGE_SHARE = 0.1


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


class MediaSteps(StepFeature):
    """The engine's media: the projector (or none) and the encodes and pieces of each step."""

    def __init__(self, projector: Projector | None, m: LoadedModel, s: wire.WorkerSettings,
                 fail: FailSlot | None = None) -> None:
        self.proj = projector
        self.fail = fail  # how a request whose image failed ends (the engine's)
        self.mrope = projector is not None and projector.mrope  # M-RoPE positions (media/mrope.py)
        self.m = m
        self.model_id = s.model_id
        self.piece = max(1, min(m.n_batch, ll.llama_n_ubatch(m.ctx)))
        self._batch: EmbdBatch | None = None
        self.threads = ImageThreads()  # encodes and side decodes: here alone, niced beside other streams
        self._intake: cf.ThreadPoolExecutor | None = None  # preparing requests with media (``intake``)
        self._prep: set[cf.Future[Any]] = set()  # those being prepared there now
        self.side = SideContext(m, s, self.piece)
        self._pending: dict[MediaChunk, tuple[cf.Future[np.ndarray], Job]] = {}
        self._side: dict[MediaChunk, tuple[cf.Future[bytes], Job, int]] = {}  # decoding in the side context
        self.pieces = 0  # image pieces decoded on the engine's thread (one per step at most)
        self.side_images = 0  # images decoded in the side context and copied into their slot
        self.share = IMAGE_SHARE
        self._last_step = 0.0
        self._waited = 0.0

    @classmethod
    def load(cls, s: wire.WorkerSettings, m: LoadedModel, fail: FailSlot | None = None) -> MediaSteps:
        return cls(load_projector(s, m), m, s, fail)

    @property
    def on(self) -> bool:
        """The model takes images (it has a projector)."""
        return self.proj is not None

    def model_info(self, info: wire.ModelInfo) -> wire.ModelInfo:
        if self.proj is None:
            return info
        return msgspec.structs.replace(info, vision=self.proj.vision, audio=self.proj.audio, mmproj_bytes=self.proj.nbytes, mmproj_device=self.proj.device,
                                       mmproj_buffers=self.proj.buffers)

    @property
    def kv_bytes(self) -> int:
        """The side context's buffers (0 until an image first went beside other streams)."""
        return self.side.kv_bytes

    @property
    def encodes(self) -> int:
        return self.proj.encodes if self.proj is not None else 0

    # ------------------------------------------------------------------ preparing (any thread)

    @property
    def intake(self) -> cf.ThreadPoolExecutor:
        """Where a request that carries media is prepared (worker/process.py): one thread at
        nice ``BESIDE_NICE`` and ``SCHED_IDLE`` like the beside thread, so the work of
        reading its files (images decoded, a recording's mel spectrogram, which libmtmd
        computes on threads of its own, which inherit the priority) takes only the cores the
        decode threads leave, and ``preparing`` gives it its share of each step. At normal
        priority beside two streams, recordings sent back to back (each a cached prefix:
        their preparation all there was to do) held the streams to 0.34-0.37x of their rate
        alone (bench/probes/audio_beside.py). The windows of one recording (``media_group``)
        are prepared on the ordinary render threads instead (worker/process.py)."""
        if self._intake is None:
            self._intake = cf.ThreadPoolExecutor(1, thread_name_prefix=INTAKE_THREAD, initializer=start_thread,
                                                 initargs=(INTAKE_THREAD, BESIDE_NICE))
        return self._intake

    def preparing(self, fut: cf.Future[Any]) -> None:
        """A request with media is being prepared on ``intake``: the step gives it its share
        (``_give_share``) until ``fut`` is done."""
        self._prep.add(fut)
        fut.add_done_callback(self._prep.discard)

    def tokenize(self, text: str, media: list[bytes], *, add_special: bool) -> MediaPrompt:
        if self.proj is None:
            raise RequestRejected("invalid_request", f"model {self.model_id} does not take images: it has no "
                                                     "multimodal projector (set mmproj for it)")
        return self.proj.tokenize(text, media, add_special=add_special)

    # ------------------------------------------------------------------ the step (engine thread)

    def step(self, slots: list[Slot], fail: FailSlot) -> None:
        """Start the encodes the slots' prompts need, collect finished ones, and decode one
        image piece (before the step's batch of tokens) or, beside other streams, hand the
        image to the side context."""
        if self.proj is None or not (self._pending or self._side or self._prep or any(_media_job(s) for s in slots)):
            return
        others = _others_streaming(slots)
        self._give_share(others)
        self._collect(slots, fail)
        for slot, job, toks in _media_slots(slots):
            for span in toks.chunks:
                if span.end > slot.prompt_pos and span.embd is None and span not in self._pending:
                    self._encode_later(span, job, others)
                    if others:
                        break  # one at a time while others stream
        if not others:
            self._collect(slots, fail)  # encoded here and now: decoded in this step
        for slot, job, toks in _media_slots(slots):
            at = toks.chunk_at(slot.prompt_pos)
            if at is None or at.embd is None or at in self._side:
                continue
            if others and self.side.usable:
                self._decode_beside(slot, job, at)
            else:
                self._decode_piece(slot, job, at, fail)
                return

    def before_batch(self, slots: list[Slot]) -> list[Slot]:
        assert self.fail is not None
        self.step(slots, self.fail)
        return slots

    def idle(self) -> None:
        self.wait()

    def wait(self, timeout: float = 0.5) -> None:
        """Nothing else to decode this step: wait for an encode or side decode instead of spinning."""
        if futs := self._in_flight():
            cf.wait(futs, timeout=timeout, return_when=cf.FIRST_COMPLETED)

    def close(self) -> None:
        for fut, _ in self._pending.values():
            fut.cancel()
        self.threads.shutdown()
        if self._intake is not None:
            self._intake.shutdown(wait=False, cancel_futures=True)
        self._pending.clear()
        self._side.clear()
        if self.proj is not None:
            self.proj.free()

    def _give_share(self, others: bool) -> None:
        """Beside other streams, image work in flight (niced: it gets only the cores the decode
        threads leave) gets ``share`` of the time: the engine waits for it that long a step
        (measured from the last step's own time; none at the first step of that work)."""
        futs = self._in_flight()
        if not (others and futs):
            self._last_step = self._waited = 0.0
            return
        now = time.perf_counter()
        waited = 0.0
        if self._last_step > 0:
            busy = max(0.0, now - self._last_step - self._waited)
            cf.wait(futs, timeout=min(0.5, busy * self.share / (1 - self.share)), return_when=cf.FIRST_COMPLETED)
            waited = time.perf_counter() - now
        self._last_step, self._waited = now, waited

    def _in_flight(self) -> list[cf.Future[Any]]:
        """The encodes and side decodes not collected yet, and the requests being prepared."""
        return [f for f, _ in self._pending.values()] + [f for f, _, _ in self._side.values()] + list(self._prep)

    def _embd_batch(self, n_embd: int) -> EmbdBatch:
        """A batch for image pieces: 4 positions an embedding with M-RoPE."""
        return EmbdBatch(self.piece, n_embd, mrope.N_POS_PER_EMBD if self.mrope else 1)

    def _encode_later(self, span: MediaChunk, job: Job, beside: bool) -> None:
        assert self.proj is not None
        self._pending[span] = (self.threads.submit(beside, self.proj.encode, span), job)

    def _collect(self, slots: list[Slot], fail: FailSlot) -> None:
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
                span.embd = fut.result()
        for span, (sfut, job, pos) in list(self._side.items()):
            slot = running.get(id(job))
            if slot is None or slot.job is not job or slot.prompt_pos != pos:  # ended meanwhile
                sfut.cancel()
                if sfut.done() or sfut.cancelled():
                    del self._side[span]
                continue
            if sfut.done():
                del self._side[span]
                self._take_side(slot, job, span, sfut, fail)

    def _decode_beside(self, slot: Slot, job: Job, span: MediaChunk) -> None:
        """Hand the rest of ``span`` to the side context (on the niced thread), from the slot's KV now."""
        assert span.embd is not None
        off = slot.prompt_pos - span.start
        rows, start, non_causal, seq_len = span.embd[off:], len(slot.cached), span.non_causal, slot.prompt_pos
        state = save_seq(self.m.ctx, slot.index)
        batch = self._embd_batch(rows.shape[1])
        p0 = kv_pos(job.tokens, span.start) if self.mrope else 0  # M-RoPE: the image's first position

        def work(ctx: ll.llama_context_p) -> None:
            for at in range(0, rows.shape[0], self.piece):
                piece = rows[at: at + self.piece]
                rc = decode_embd(ctx, batch, piece, start + at, 0, non_causal,
                                 mrope_at=(span, p0, off + at) if self.mrope else None)
                if rc != 0:
                    raise RuntimeError(f"decode of an image failed: llama_decode returned {rc}")

        n_stream = 1 if self.side.s.speculative != "off" else self.m.n_slots  # kv_unified as in model.py
        self._side[span] = (self.threads.submit(True, self.side.run, state if seq_len else b"", work, n_stream), job,
                            slot.prompt_pos)

    def _take_side(self, slot: Slot, job: Job, span: MediaChunk, fut: cf.Future[bytes], fail: FailSlot) -> None:
        exc = fut.exception()
        if isinstance(exc, SideUnsupported):  # the slot's KV is as it was: decode the image here
            log.warning("images go on the engine's thread from now on: %s", exc)
            self.side.usable = False
            return
        if exc is not None:
            fail(slot, job, f"{type(exc).__name__}: {exc}")
            return
        ll.llama_memory_seq_rm(self.m.memory, slot.index, -1, -1)
        if not restore_seq(self.m.ctx, slot.index, fut.result()):
            fail(slot, job, "the image's KV could not be copied into its slot")
            return
        slot.cached.extend(job.tokens[slot.prompt_pos: span.end])
        slot.prompt_pos = span.end
        span.embd = None
        self.side_images += 1

    def _decode_piece(self, slot: Slot, job: Job, span: MediaChunk, fail: FailSlot) -> None:
        assert span.embd is not None
        if self._batch is None:
            self._batch = self._embd_batch(span.embd.shape[1])
        off = slot.prompt_pos - span.start
        k = min(self.piece, span.n_tokens - off)
        at = (span, kv_pos(job.tokens, span.start), off) if self.mrope else None
        rc = decode_embd(self.m.ctx, self._batch, span.embd[off: off + k], len(slot.cached), slot.index,
                         span.non_causal, mrope_at=at)
        if rc != 0:
            fail(slot, job, f"decode of an image failed: llama_decode returned {rc}")
            return
        self.pieces += 1
        slot.cached.extend(job.tokens[slot.prompt_pos: slot.prompt_pos + k])
        slot.prompt_pos += k
        if slot.prompt_pos == span.end:
            span.embd = None  # decoded: the floats are not needed again


def decode_embd(ctx: ll.llama_context_p, b: EmbdBatch, rows: np.ndarray, pos: int, seq: int, non_causal: bool,
                *, mrope_at: tuple[MediaChunk, int, int] | None = None) -> int:
    """One llama_decode of embedding ``rows`` at positions ``pos``.. of sequence ``seq``
    (causal attention off for it when the image attends non-causally); llama_decode's code.
    ``mrope_at``: (the image, its first position, the rows' offset in it): M-RoPE's t/y/x
    positions instead (media/mrope.py)."""
    k = rows.shape[0]
    b.embd[: k * b.n_embd] = rows.ravel()
    if mrope_at is not None:
        mrope_at[0].write_mrope(b.pos, mrope_at[1], mrope_at[2], k)
    else:
        b.pos[:k] = list(range(pos, pos + k))
    for i in range(k):
        b.seq[i] = seq
        b.logits[i] = 0
    b.batch.n_tokens = k
    if non_causal:
        ll.llama_set_causal_attn(ctx, False)
    try:
        return int(ll.llama_decode(ctx, b.batch))
    finally:
        if non_causal:
            ll.llama_set_causal_attn(ctx, True)


def _media_slots(slots: list[Slot]) -> Iterator[tuple[Slot, Job, MediaPrompt]]:
    """The slots whose prompt with media is still being prefilled, with the job and its tokens."""
    for slot in slots:
        job = _media_job(slot)
        if job is not None:
            assert isinstance(job.tokens, MediaPrompt)
            yield slot, job, job.tokens


def _others_streaming(slots: list[Slot]) -> bool:
    """Whether a slot generates that media work must yield to: any stream, except the windows
    of a recording whose other windows wait for media here (``GenerateRequest.media_group``:
    one transcription's windows; the side path protects other requests' streams, not a
    request's own windows from one another)."""
    waiting = {job.req.media_group for _, job, _ in _media_slots(slots) if job.req.media_group}
    return any(s.job is not None and _media_job(s) is None and s.job.req.media_group not in waiting
               for s in slots)


def _media_job(slot: Slot) -> Job | None:
    """The slot's job while its prompt with media is still being prefilled."""
    job = slot.job
    if job is None or slot.n_gen > 0 or not isinstance(job.tokens, MediaPrompt) or not job.tokens.chunks:
        return None
    return job if slot.prompt_pos < job.tokens.chunks[-1].end else None
