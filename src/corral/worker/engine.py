"""The continuous-batching engine: n slots over one llama.cpp context. No sockets.

    engine = Engine(settings)            # loads the model (ModelLoadError on failure)
    engine.submit(GenerateRequest(...))  # or EmbedRequest; queued, joins at the next step
    engine.submit(engine.prepare(req))   # the same, tokenized first (any thread: prompts.py)
    engine.abort("id"); msgs = engine.step()   # one llama_decode; returns Delta/Finished/... messages

A slot's life: FREE -> PREFILL (prompt chunks) -> GENERATE (one token per step) -> FREE. Each ``step()``:

1. gives waiting requests a free slot: the one whose cache holds the longest valid prefix (slots.reuse_len);
2. builds ONE batch: the last token of every generating slot (and its draft: speculation/), then prompt chunks;
3. runs one ``llama_decode`` (C, releases the GIL); 4. draws the next token of every slot with logits, side
   by side on the ``sampling_threads`` (sampling/pool.py), then per slot in batch order on this thread:
   detokenizes, matches stop strings, emits Deltas (docs/internals/worker-engine.md, "One step").

Per-request features (speculation and preemption too) are ``StepFeature``s (slots.py), in ``self.features``
only when on (features.py): the engine runs their moments, never a check of its own for a feature.

Only the thread that calls ``step()`` changes llama.cpp's context (the draws only read it, each with its
own slot's sampler). ``submit``/``abort`` only queue; ``prepare`` (tokenizing) may run on another thread.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Union

import llama_cpp as ll

from corral import wire
from corral.worker.prompt import requests
from corral.worker.sampling import pool as sample_pool, sampler as sampling
from corral.worker.host import threadpool
from corral.worker.speculation import draft
from corral.worker.lora.adapters import LoraAdapters
from corral.worker.embed.embedder import Embedder
from corral.worker.features import Moments, step_features
from corral.worker.intake import Intake
from corral.worker.failures import RequestRejected
from corral.worker.model import LoadedModel, load_model, rss_bytes
from corral.worker.preempt.preemption import EngineSide, Preemption
from corral.worker.prefill import EchoChunk, fill_prompt_chunks, prompt_logprobs
from corral.worker.cache.prompt_cache import PromptCache
from corral.worker.prompt.prompts import PreparedRequest, PromptPreparer, model_template
from corral.worker.reasoning.feature import ReasoningFeature
from corral.worker.output.slot_output import SlotOutput
from corral.worker.batch import Batch
from corral.worker.slots import (Job, Slot, aborted_in_queue, begin, finished_message, equip,
                                 free_samplers, keep_prefix, pick_slot, release, slot_states)
from corral.worker.tokens import Tokenizer
from corral.worker.media.steps import MediaSteps

__all__ = ["Engine", "Outgoing", "PreparedRequest"]

log = logging.getLogger("corral.worker.engine")

Outgoing = Union[wire.Delta, wire.Finished, wire.RequestFailed, wire.Embeddings, wire.Tokenized]


class Engine:
    def __init__(self, settings: wire.WorkerSettings) -> None:
        self.settings = settings
        self.m: LoadedModel = load_model(draft.main_settings(settings))  # room for a draft model's
        self.threadpool = threadpool.attach(self.m.ctx, max(self.m.threads, self.m.threads_batch))  # as llama-server
        self.set_threads = self.m.set_threads  # threads for the next decodes (the thread governor's)
        self.lora = LoraAdapters.load(self.m, settings)  # the adapters and their turns (lora/)
        self.media = MediaSteps.load(settings, self.m, self._fail)  # the projector, media in the step (media/)
        self.m.info = self.media.model_info(self.lora.report(self.m.info))
        self.tok = Tokenizer(self.m)
        self.spec = draft.speculator(settings, self.m, self.tok.is_eog)  # n-gram or draft-model drafts (speculation/)
        self.info = self.m.info
        self.template, self._template_error = model_template(settings, self.m, self.tok)  # prompt/prompts.py
        self.prompts = PromptPreparer(self.tok, self.template, self._template_error, self.m.n_ctx_slot,
                                      model_id=settings.model_id, n_batch=self.m.n_batch)
        self.prompts.media = self.media
        self.reasoning = ReasoningFeature(settings, self.template, self.tok, self.info.reasoning_format, self.m.n_vocab)
        self.embedder = Embedder(self.m, self.tok, settings)  # embeddings, reranking (embed/)
        self.intake = Intake(settings, self.m, self.prompts, self.reasoning, self.lora)  # a request's way in
        self.prepare = self.intake.prepare  # tokenize and check (RequestRejected); thread-safe (intake.py)
        self.slots = [Slot(i) for i in range(self.m.n_slots)]
        self.waiting: deque[Job] = deque()
        self.out: list[Outgoing] = []
        self.batch = Batch(self.m.n_batch)  # the step's batch (preemption's recomputes use it between steps)
        self.jobs: dict[str, Job] = {}  # every accepted request not yet ended, by id (paused ones too)
        self.tokens_generated = 0
        self.tokens_prompt = 0
        self.gen_steps = 0  # slot-steps that drew tokens
        self.pool = sample_pool.pool_for(settings.sampling_threads, self.info)
        self.prompt_cache = PromptCache(self.m, settings)  # RAM, disk (cache/); .store: KV store
        side = EngineSide(self.m, self.slots, self.batch, self.jobs.get, self.waiting.remove, self.waiting.appendleft,
                          self._ended, self.lora.use)  # all preemption reaches of the engine
        self.preempt = Preemption(side, self.prompt_cache.store, abort_decodes=self.spec.undoable)  # preempt/
        self.features = step_features(settings, self.media, self.lora, self.reasoning, self.prompt_cache, self.spec,
                                      self.preempt)  # the step features turned on (features.py)
        self.on = Moments(self.features, self.m.ctx)  # for each engine-wide moment, the features with it

    # ------------------------------------------------------------------ commands

    def submit(self, req: wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest | PreparedRequest) -> None:
        """Queue a request (prepared by ``prepare`` or not). Bad requests are answered with
        RequestFailed at once."""
        prepared = req if isinstance(req, PreparedRequest) else None
        if prepared is not None:
            req = prepared.req
        assert not isinstance(req, PreparedRequest)
        try:
            if isinstance(req, wire.EmbedRequest):
                self.embedder.submit(req)
                return
            if isinstance(req, wire.TokenizeRequest):
                self.out.append(requests.tokenize(self.tok, req, self.prompts))
                return
            if req.id in self.jobs:
                raise RequestRejected("invalid_request", f"request id {req.id!r} is already in use")
            job = self.intake.job(prepared if prepared is not None else self.prepare(req))
            self.jobs[req.id] = job
            self.waiting.append(job)
        except RequestRejected as exc:
            self.out.append(wire.RequestFailed(req.id, exc.code, exc.message))
        except Exception as exc:  # noqa: BLE001 - no request may crash the worker
            log.exception("request %s failed on submit", req.id)
            self.out.append(wire.RequestFailed(req.id, "internal", f"{type(exc).__name__}: {exc}"))

    def abort(self, request_id: str) -> None:
        """Free the request's slot (or drop it from the queue) and answer Finished(abort)."""
        job = self.jobs.get(request_id)
        if job is None or any(f.abort(request_id) for f in self.on.abort):  # a paused one: preempt/
            return
        for slot in self.slots:
            if slot.job is job:
                self._finish(slot, "abort")
                return
        self.waiting.remove(job)
        sampling.free_sampler(job.grammar)
        job.grammar = None
        self._ended(job, aborted_in_queue(job, time.perf_counter()), 0)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.embedder.waiting or any(s.busy for s in self.slots)
                    or any(f.has_work() for f in self.on.has_work))

    def stats(self) -> wire.Stats:
        return wire.Stats(slots_busy=sum(1 for s in self.slots if s.busy), slots_total=len(self.slots),
                          waiting=len(self.waiting) + len(self.embedder.waiting), rss_bytes=rss_bytes(),
                          model_bytes=self.info.model_bytes, kv_bytes=self.info.kv_bytes + self.embedder.kv_bytes + self.media.kv_bytes,
                          tokens_generated=self.tokens_generated, tokens_prompt=self.tokens_prompt,
                          slots=slot_states(self.slots, self.m.n_ctx_slot), spec_drafted=self.spec.drafted,
                          spec_accepted=self.spec.accepted, gen_steps=self.gen_steps,
                          prompt_cache=self.prompt_cache.stats())

    def close(self) -> None:
        self.pool.close()
        for f in self.features:
            f.close()
        if not self.media.on:
            self.media.close()  # its threads, there without a projector too
        free_samplers(self.slots, self.waiting)
        self.m.free()
        if self.threadpool is not None:
            self.threadpool.free()

    def fail_all(self, message: str) -> list[Outgoing]:
        """End every accepted request with RequestFailed(internal); the engine stays usable."""
        self._fail_running(message)
        for f in self.on.fail_all:
            f.fail_all(message)  # the paused ones (preempt/)
        while self.waiting:
            job = self.waiting.popleft()
            sampling.free_sampler(job.grammar)
            job.grammar = None
            self._ended(job, wire.RequestFailed(job.req.id, "internal", message), 0)
        self.out += self.embedder.fail_waiting(message)
        return self.take_output()

    def take_output(self) -> list[Outgoing]:
        out, self.out = self.out, []
        return out

    # ------------------------------------------------------------------ scheduling

    def _admit(self) -> None:
        if not self.waiting:
            return
        free = [s for s in self.slots if not s.busy]
        while self.waiting and free:
            job = self.waiting.popleft()
            # a prefix of cells of the job's cache tenant and adapter set (slots.py)
            best, best_n = pick_slot(free, job.tokens, self.m, job.req.cache_tenant, job.lora, job.tail)
            free.remove(best)
            try:
                best_n = self.prompt_cache.admit(best, job, best_n)  # saves the old cells, may restore more
                self._start(best, job, best_n)
            except Exception as exc:  # noqa: BLE001 - fail this request, not the worker
                log.exception("request %s failed to start", job.req.id)
                self._fail(best, job, f"{type(exc).__name__}: {exc}")

    def _clear_slot(self, slot: Slot) -> None:
        ll.llama_memory_seq_rm(self.m.memory, slot.index, -1, -1)
        slot.cached = []

    def _start(self, slot: Slot, job: Job, reuse: int) -> None:
        req = job.req
        echo_lp = req.echo and req.logprobs is not None
        reuse = keep_prefix(slot, job.tokens, 0 if echo_lp else reuse, self.m)  # echo: every prompt token's logits
        p = job.req.params
        begin(slot, job, reuse, self.m.n_ctx_slot - len(job.tokens), time.perf_counter(), self.settings.default_max_tokens)
        requested = job.grammar is not None
        slot.features = tuple(f for f in self.features if f.admitted(slot, job))  # may take the grammar (reasoning)
        grammar, job.grammar = job.grammar, None  # the slot's sampler owns it (frees it on failure too)
        chat = req.messages is not None and self.template is not None and not p.ignore_eos and not requested
        equip(slot, job, grammar, self.tok, default_seed=self.settings.seed,
              template_stops=self.template.stop_strings if chat and self.template is not None else ())
        slot.echo_logprobs = [wire.TokenLogprob(self.tok.prompt_piece(job.tokens[0]), None, [], job.tokens[0])] if echo_lp else None
        if req.echo and not echo_lp:
            self.out.append(wire.Delta(req.id, requests.echo_text(self.tok, req, job.tokens), 0))
        if slot.max_tokens == 0 and not echo_lp:
            self._finish(slot, "length")

    # ------------------------------------------------------------------ the step

    def step(self) -> list[Outgoing]:
        """Run one decode over all busy slots; return the messages it produced."""
        if self.embedder.waiting:  # embeddings and reranks, between generation steps, in shared decodes
            answers, n_tokens = self.embedder.run_waiting()
            self.out += answers
            self.tokens_prompt += n_tokens
        for f in self.on.before_admit:
            f.before_admit()  # paused requests resuming go first
        self._admit()
        turn = self.slots
        for f in self.on.before_batch:  # images' encodes and pieces; one adapter set's slots; an urgent prompt alone
            turn = f.before_batch(turn)
        b = self.batch
        n, outputs = self.on.write_decodes(b, turn)  # pending tokens (and drafts: speculation/)
        echo_chunks: list[EchoChunk] = []
        n = fill_prompt_chunks(b, turn, n, outputs, echo_chunks)  # prefill.py
        if n == 0:
            for f in self.on.idle:
                f.idle()  # an image still encoding, nothing else to decode
            return self.take_output()
        rc = self.on.decode(b, n, outputs, echo_chunks)  # aborted for an urgent request: 0, undone, nothing to draw
        if rc != 0:
            why = "no room in the KV cache" if rc == 1 else f"llama_decode returned {rc}"
            log.error("decode failed: %s", why)
            self._fail_running(f"decode failed: {why}")
            return self.take_output()
        for slot, at, pos, count in echo_chunks:  # prompt logprobs (echo: prefill.py)
            if (echo := prompt_logprobs(slot, at, pos, count, self.m, self.tok)) is not None:
                self.out.append(echo)
                if slot.max_tokens == 0:
                    self._finish(slot, "length")
        todo = [(slot, idx) for slot, idx in outputs if slot.job is not None]
        if todo:  # draws side by side (sampling/pool.py), the rest in batch order here
            sample_pool.presync(self.m.ctx)
            for (slot, _), drawn in zip(todo, self.pool.map(self._draw, todo)):
                self._take(slot, drawn)
        return self.take_output()

    def _fail_running(self, message: str) -> None:
        for slot in self.slots:
            if slot.job is not None:
                self._fail(slot, slot.job, message)

    def _fail(self, slot: Slot, job: Job, message: str) -> None:
        """End ``job``, running (or starting) in ``slot``, with RequestFailed(internal); the others
        go on. The slot is freed with its samplers (and the job's grammar, if no sampler took
        it) and its cache cleared (not trusted after a failure), unless it holds another job."""
        sampling.free_sampler(job.grammar)
        job.grammar = None
        if slot.job is job or slot.job is None:
            release(slot)
            self._clear_slot(slot)
        self._ended(job, wire.RequestFailed(job.req.id, "internal", message), 0)

    def _ended(self, job: Job, last: wire.Finished | wire.RequestFailed, n_eval: int) -> None:
        """``job`` ended with ``last`` (``n_eval``: its prompt tokens decoded, not reused)."""
        self.jobs.pop(job.req.id, None)
        self.tokens_prompt += n_eval
        self.out.append(last)

    def _draw(self, item: tuple[Slot, int]) -> list[sample_pool.Drawn]:
        """On any sampling thread: touches only this slot's sampler (a draw per verified draft token)."""
        slot, idx = item
        for f in slot.features:
            if (forced := f.after_logits(slot)) is not None:  # e.g. the thinking's budget is spent
                return [sample_pool.Drawn(forced)]

        def one(i: int) -> sample_pool.Drawn:
            return sample_pool.draw(slot.sampler, self.m.ctx, i, is_eog=self.tok.is_eog, ends_on_eog=not slot.ignore_eos,
                                    logprobs=slot.logprobs, n_vocab=self.m.n_vocab, piece=self.tok.piece)
        for f in slot.features:
            if (drawn := f.draws(slot, idx, one)) is not None:  # a draft's positions (speculation/)
                return drawn
        return [one(idx)]

    def _take(self, slot: Slot, drawn: list[sample_pool.Drawn]) -> None:
        """A slot's drawn tokens, on the engine thread: a failure fails this request only."""
        job, features = slot.job, slot.features  # (the slot is free once the request ends)
        assert job is not None
        self.gen_steps += 1
        try:
            for d in drawn:
                if slot.job is not job or slot.out is None:
                    break  # it finished on an earlier token
                if d.error is not None:
                    raise d.error
                self._next_token(slot, slot.out, d.token, d.logprob)
        except Exception as exc:  # noqa: BLE001 - fail this request, not the worker
            log.exception("sampling failed for %s", job.req.id)
            self._fail(slot, job, f"{type(exc).__name__}: {exc}")
        for f in features:
            f.taken(slot, job, drawn)  # a draft's rollback (speculation/)

    def _next_token(self, slot: Slot, out: SlotOutput, tok: int | None, lp: wire.TokenLogprob | None) -> None:
        now = time.perf_counter()
        if slot.n_gen == 0:
            slot.t_first = now
        if tok is None:  # the grammar is complete and allows nothing more
            self._finish(slot, "stop")
            return
        slot.n_gen += 1
        self.tokens_generated += 1
        if not slot.ignore_eos and self.tok.is_eog(tok):
            instead = next((t for f in slot.features if (t := f.end_of_generation(slot)) is not None), None)
            if instead is None:
                self._finish(slot, "stop")
                return
            tok = instead
        delta = out.token(self.tok.piece(tok), lp, tok)
        if delta is not None:
            self.out.append(delta)
        why: wire.FinishReason | None = "stop" if out.stopped else None
        for f in slot.features:
            why = why or f.token_accepted(slot, tok, delta)
        if why is not None:
            self._finish(slot, why)
        elif slot.n_gen >= slot.max_tokens:
            self._finish(slot, "length")
        else:
            slot.pending = tok

    def _finish(self, slot: Slot, reason: wire.FinishReason) -> None:
        job = slot.job
        assert job is not None
        if reason != "abort" and slot.out is not None:
            delta = slot.out.finish()
            if delta is not None:
                self.out.append(delta)
        fin = finished_message(slot, job, reason, time.perf_counter())
        for f in slot.features:
            f.finished(slot, fin)
        self._ended(job, fin, len(job.tokens) - slot.n_cached)
        release(slot)
