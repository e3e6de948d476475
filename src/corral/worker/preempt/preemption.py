"""Pausing a running generation between decode steps, and resuming it (fair-share
preemption; the router decides who: docs/internals/fair-share.md, "Preemption").

    engine.preempt.pause("req-7")   # -> wire.Paused; its slot is free at once
    engine.preempt.resume("req-7")  # queued; it takes a free slot at the next step's start

A paused request keeps everything its slot held that is not the KV cache: the job, the
slot's sampler (and its grammar, RNG, penalties' history), the output's stop matcher,
tool-call parser and detokenizer (``SlotOutput``), the reasoning split and budget
(``SlotReasoning``), every step feature's state (one field of the slot each: speculation's,
the time limit's, ...), and the counters (tokens generated, limits, timings): the slot's
request fields, every field but ``slots.CELL_FIELDS``, moved as they are. Its KV, the cells of the tokens in ``slot.cached``, is saved into the worker's
host-RAM store (``worker/cache/kv_store.py``) as a pinned entry; where the store has no room it
is dropped, and recomputed on resume before the slot joins the next batch (the prompt
in batches, from any prefix a free slot still holds, then one decode per token generated
so far: the shapes they were first decoded in, so the KV is the same; a stall of the
other streams of about that many one-token steps, the price of having no room). The slot's own cells stay in place after the pause (``slot.cached`` untouched),
so a request that resumes into a slot nobody used meanwhile restores nothing.

With greedy sampling the resumed stream is the stream it would have been: the same
sampler continues from the same logits (with a recomputed KV too, except where the first
decode was not one prompt batch then single tokens: a prompt prefilled in chunks beside
other streams, or speculation's drafts; then a near tie may flip, as with a reused prefix). A paused
request's id stays in use; Abort answers Finished(abort) and frees its samplers; an
engine failure fails it like a running one. A request mid-prefill that collects prompt
logprobs (echo) is not paused (``Paused(paused=False)``): those depend on the batch; nor
one with images still prefilling, or with images and no room in the store (an image's
positions hold embeddings, not tokens: they cannot be recomputed from ``slot.cached``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.batch import Batch
from corral.worker.prefill import cut_chunk
from corral.worker.sampling import sampler as sampling
from corral.worker.cache.kv_store import HostKVStore, restore_seq, save_seq
from corral.worker.model import LoadedModel
from corral.worker.lora.state import BASE, LoraKey
from corral.worker.media.prompt import recomputable
from corral.worker.slots import (CELL_FIELDS, Job, Slot, StepFeature, aborted_in_queue, finished_message, pick_slot,
                                 release)
from corral.worker.preempt.urgent import UrgentStarts, Before

__all__ = ["EngineSide", "Preemption", "PausedJob", "store_key"]

log = logging.getLogger("corral.worker.preempt.preemption")

# a slot's request fields: what moves with a paused request (the rest are its cells')
_KEPT_FIELDS = [f.name for f in fields(Slot) if f.name not in CELL_FIELDS]


def store_key(request_id: str) -> str:
    """The key of a paused request's entry in the host KV store."""
    return f"paused:{request_id}"


@dataclass(frozen=True)
class EngineSide:
    """All preemption reaches of the engine (which builds it, and imports this module)."""

    m: LoadedModel
    slots: list[Slot]
    batch: Batch  # the step's buffers: recomputes run between steps
    job: Callable[[str], Job | None]  # an accepted request not ended yet (a paused one too), by id
    unqueue: Callable[[Job], None]  # out of the engine's queue (paused before it had a slot)
    requeue: Callable[[Job], None]  # back at the queue's front
    ended: Callable[[Job, wire.Finished | wire.RequestFailed, int], None]  # its last message, prompt tokens evaluated
    use_lora: Callable[[LoraKey], None]  # an adapter set on the context (before a recompute)


@dataclass(eq=False)
class PausedJob:
    job: Job
    slot: Slot | None  # the slot's request fields (a detached copy); None: paused before it had a slot
    tokens: list[int]  # the tokens whose KV it had, at positions 0..len-1
    kept_kv: bool
    since: float
    lora_key: LoraKey = BASE  # the adapter set its KV was computed under (worker/lora/adapters.py)


class Preemption(StepFeature):
    """The engine's paused requests, a step feature of every generation engine (the engine
    thread only): ``before_admit`` resumes, ``before_batch`` and ``decode`` are the urgent
    starts' (urgent.py), ``abort``/``fail_all``/``has_work``/``close`` the paused requests'.
    ``abort_decodes``: False where an aborted decode cannot be undone (a draft model's drafts)."""

    name = "preempt"

    def __init__(self, engine: EngineSide, store: HostKVStore, *, abort_decodes: bool = True) -> None:
        self.e = engine
        self.store = store
        self.held: dict[str, PausedJob] = {}  # the paused requests, by id
        self._resuming: deque[PausedJob] = deque()
        self.pauses = 0
        self.kept = 0
        self.recomputed = 0  # resumes that prefilled their tokens again (some or all)
        self.urgent = UrgentStarts(engine.m, abort=abort_decodes)  # the request that takes a paused slot starts at once
        self._undo: list[Before] = []  # the step's slots as they were before its batch was filled

    def pause(self, request_id: str) -> wire.Paused:
        e = self.e
        job = e.job(request_id)
        if job is None or request_id in self.held:
            return wire.Paused(id=request_id, paused=False)
        slot = next((s for s in e.slots if s.job is job), None)
        if slot is None:  # accepted, not started yet: nothing to keep
            e.unqueue(job)
            self.held[request_id] = PausedJob(job, None, [], False, time.monotonic())
            self.pauses += 1
            return wire.Paused(id=request_id, paused=True)
        fixed = not recomputable(job.tokens)  # media: their KV holds embeddings, not tokens (media/prompt.py)
        if slot.echo_logprobs is not None or (fixed and slot.n_gen == 0):
            return wire.Paused(id=request_id, paused=False)
        tokens = list(slot.cached)
        state = save_seq(e.m.ctx, slot.index) if tokens else b""
        kept = bool(state) and self.store.put(store_key(request_id), tokens, state, pinned=True)
        if fixed and not kept:
            return wire.Paused(id=request_id, paused=False)
        for f in slot.features:
            f.paused(slot)
        saved, empty = Slot(slot.index), Slot(slot.index)
        for name in _KEPT_FIELDS:  # the objects now belong to the paused job: release() frees nothing
            setattr(saved, name, getattr(slot, name))
            setattr(slot, name, getattr(empty, name))
        release(slot)  # slot.cached (and its cells) stay: reusable, or resumed in place
        self.held[request_id] = PausedJob(job, saved, tokens, kept, time.monotonic(), slot.lora)
        self.pauses += 1
        self.kept += kept
        return wire.Paused(id=request_id, paused=True, kept_kv=kept, n_tokens=len(tokens),
                           state_bytes=len(state) if kept else 0)

    def resume(self, request_id: str) -> None:
        """Queue the paused request to take a free slot at the next step's start."""
        p = self.held.get(request_id)
        if p is not None and p not in self._resuming:
            self._resuming.append(p)

    def has_work(self) -> bool:
        return bool(self._resuming)

    def before_batch(self, slots: list[Slot]) -> list[Slot]:
        self._undo = self.urgent.before(slots)
        return self.urgent.plan(slots, self.e.job, self.e.batch.cap)

    def decode(self, b: Batch, n: int, outputs: list[tuple[Slot, int]], echo_chunks: list[Any]) -> int:
        undo, self._undo = self._undo, []
        return self.urgent.decode(b, n, undo, outputs, echo_chunks)

    def before_admit(self) -> None:
        """Resume what waits to resume, into free slots (before the engine's queue)."""
        e = self.e
        while self._resuming:
            free = [s for s in e.slots if not s.busy]
            p = self._resuming[0]
            if p.slot is None:  # it never had a slot: back to the front of the queue
                self._resuming.popleft()
                del self.held[p.job.req.id]
                e.requeue(p.job)
                continue
            if not free:
                return
            self._resuming.popleft()
            del self.held[p.job.req.id]
            try:
                self._into(p, free)
            except Exception as exc:  # noqa: BLE001 - fail this request, not the worker
                log.exception("request %s failed to resume", p.job.req.id)
                self._fail(p, f"resume failed: {type(exc).__name__}: {exc}")

    def _into(self, p: PausedJob, free: list[Slot]) -> None:
        e, m = self.e, self.e.m
        entry = self.store.pop(store_key(p.job.req.id))
        key = p.lora_key  # only a slot of its adapter set serves its cells (worker/lora/adapters.py)
        tenant = p.job.req.cache_tenant  # and only one of its cache tenant
        same = [s for s in free if s.lora == key and s.tenant == tenant]
        slot = next((s for s in same if s.cached == p.tokens), None)
        if slot is None:
            slot, reuse = pick_slot(same or free, p.tokens + [-1], m, tenant, key) if p.tokens else (free[0], 0)
            slot.tenant, slot.lora = tenant, key
            e.use_lora(key)
            assert p.slot is not None
            reuse = max(0, min(reuse, p.slot.n_cached))  # the prompt's rest decodes as it first did
            restored = False
            if entry is not None and reuse < len(p.tokens):
                ll.llama_memory_seq_rm(m.memory, slot.index, -1, -1)
                slot.cached = []
                restored = restore_seq(m.ctx, slot.index, entry.state)
                if restored:
                    slot.cached = list(p.tokens)
            if not restored:
                self._recompute(slot, p.tokens, reuse, len(p.job.tokens), p.job.cuts)
        assert p.slot is not None
        for name in _KEPT_FIELDS:
            setattr(slot, name, getattr(p.slot, name))
        for f in slot.features:
            f.resumed(slot)

    def _recompute(self, slot: Slot, tokens: list[int], reuse: int, n_prompt: int, cuts: tuple[int, ...]) -> None:
        """Decode ``tokens`` into ``slot`` again (its first ``reuse`` are there), as they were
        decoded first: the prompt in batches, cut where the step cut it (``Job.cuts``),
        then each generated token alone. A batch of
        another shape rounds differently on a CPU, enough to flip a near tie of a greedy
        answer; replayed this way the KV is the one it had (measured: same tokens)."""
        m = self.e.m
        if not (reuse > 0 and ll.llama_memory_seq_rm(m.memory, slot.index, reuse, -1)):
            reuse = 0
            ll.llama_memory_seq_rm(m.memory, slot.index, -1, -1)
        slot.cached = list(tokens[:reuse])
        if reuse < len(tokens):
            self.recomputed += 1
        b = self.e.batch
        pos = reuse
        while pos < len(tokens):
            n = cut_chunk(pos, min(b.cap, n_prompt - pos), n_prompt, cuts) if pos < n_prompt else 1
            for k in range(n):
                b.token[k] = tokens[pos + k]
                b.pos[k] = pos + k
                b.seq[k] = slot.index
                b.logits[k] = 0
            b.batch.n_tokens = n
            rc = ll.llama_decode(m.ctx, b.batch)
            if rc != 0:
                ll.llama_memory_seq_rm(m.memory, slot.index, -1, -1)
                slot.cached = []
                raise RuntimeError(f"llama_decode returned {rc} while recomputing {len(tokens)} tokens")
            slot.cached.extend(tokens[pos: pos + n])
            pos += n

    def abort(self, request_id: str) -> bool:
        """Abort a paused request (Finished(abort)); False when it is not paused."""
        p = self.held.pop(request_id, None)
        if p is None:
            return False
        if p in self._resuming:
            self._resuming.remove(p)
        if p.slot is None:
            sampling.free_sampler(p.job.grammar)
            p.job.grammar = None
            self.e.ended(p.job, aborted_in_queue(p.job, time.perf_counter()), 0)
        else:
            fin = finished_message(p.slot, p.job, "abort", time.perf_counter())
            self.e.ended(p.job, fin, len(p.job.tokens) - p.slot.n_cached)
            release(p.slot)
        self.store.pop(store_key(request_id))
        return True

    def _fail(self, p: PausedJob, message: str) -> None:
        self.store.pop(store_key(p.job.req.id))
        if p.slot is not None:
            release(p.slot)
        sampling.free_sampler(p.job.grammar)
        p.job.grammar = None
        self.e.ended(p.job, wire.RequestFailed(p.job.req.id, "internal", message), 0)

    def fail_all(self, message: str) -> None:
        """End every paused request with RequestFailed(internal) (the engine failed)."""
        for p in list(self.held.values()):
            self._fail(p, message)
        self.held.clear()
        self._resuming.clear()

    def close(self) -> None:
        """Free every paused request's samplers (the engine closes)."""
        for p in self.held.values():
            if p.slot is not None:
                release(p.slot)
            sampling.free_sampler(p.job.grammar)
        self.held.clear()
        self._resuming.clear()
        self.store.clear(pinned=True)
