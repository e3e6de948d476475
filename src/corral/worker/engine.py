"""The continuous-batching engine: n slots over one llama.cpp context. No sockets.

    engine = Engine(settings)            # loads the model (ModelLoadError on failure)
    engine.submit(GenerateRequest(...))  # or EmbedRequest; queued, joins at the next step
    engine.submit(engine.prepare(req))   # the same, tokenized first (any thread: prompts.py)
    engine.abort("id")
    msgs = engine.step()                 # one llama_decode; returns Delta/Finished/... messages

A slot's life: FREE -> PREFILL (prompt chunks) -> GENERATE (one token per step) -> FREE.
Each ``step()``:

1. gives waiting requests a free slot, the one whose cached tokens share the longest
   valid prefix with the prompt (prefix reuse, see ``_reuse_len``);
2. builds ONE batch: the last sampled token of every generating slot, then prompt
   chunks of prefilling slots while the n_batch budget lasts;
3. runs one ``llama_decode`` (C, releases the GIL);
4. samples every slot whose logits were computed, detokenizes, matches stop strings,
   and emits ``Delta`` / ``Finished``.

Only the thread that calls ``step()`` touches llama.cpp's context. ``submit``/``abort``
only queue; ``prepare`` (tokenizing, read-only on the vocabulary) may run on another thread.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Union

import llama_cpp as ll

from corral import wire
from corral.worker import requests, sampling
from corral.worker.embed import embed_batch
from corral.worker.failures import RequestRejected
from corral.worker.model import LoadedModel, load_model, rss_bytes
from corral.worker.prompts import PreparedRequest, PromptPreparer
from corral.worker.slot_output import SlotOutput
from corral.worker.templates import ChatTemplate, TemplateError, choose_template
from corral.worker.tokens import Tokenizer

__all__ = ["Engine", "Outgoing", "PreparedRequest"]

log = logging.getLogger("corral.worker.engine")

Outgoing = Union[wire.Delta, wire.Finished, wire.RequestFailed, wire.Embeddings, wire.Tokenized]
_ECHO_CHUNK = 32  # prompt tokens per step when each needs its logits (echo + logprobs)


@dataclass(eq=False)
class _Job:
    req: wire.GenerateRequest
    tokens: list[int]
    t_submit: float
    grammar: ll.llama_sampler_p | None = None  # owned until a slot's sampler takes it


@dataclass(eq=False)
class _Slot:
    index: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in the cache, in order
    job: _Job | None = None
    prompt_pos: int = 0  # next prompt token to decode
    n_cached: int = 0  # prompt tokens reused from the cache
    pending: int = -1  # sampled token not yet decoded (GENERATE state)
    n_gen: int = 0
    max_tokens: int = 0
    sampler: sampling.SlotSampler | None = None
    out: SlotOutput | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per token; None: no logprobs
    echo_logprobs: list[wire.TokenLogprob] | None = None  # prompt logprobs being collected
    t_start: float = 0.0
    t_first: float = 0.0

    @property
    def busy(self) -> bool:
        return self.job is not None


def _check_params(p: wire.SamplingParams) -> None:
    """The bounds the router checks too (``wire.invalid_field``): one set for both."""
    bad = wire.invalid_field(p)
    if bad is not None:
        raise RequestRejected("invalid_request", f"{bad[0]}: {bad[1]}")


class _Batch:
    """A llama_batch over buffers we own: flat arrays written with plain indexing."""

    def __init__(self, n: int) -> None:
        self.cap = n
        self.token = (ll.llama_token * n)()
        self.pos = (ll.llama_pos * n)()
        self.n_seq_id = (ctypes.c_int32 * n)(*([1] * n))
        self.seq = (ll.llama_seq_id * n)()
        self.seq_ptr = (ctypes.POINTER(ll.llama_seq_id) * n)()
        base = ctypes.addressof(self.seq)
        size = ctypes.sizeof(ll.llama_seq_id)
        for i in range(n):
            self.seq_ptr[i] = ctypes.cast(base + i * size, ctypes.POINTER(ll.llama_seq_id))
        self.logits = (ctypes.c_int8 * n)()
        self.batch = ll.llama_batch(
            token=ctypes.cast(self.token, ctypes.POINTER(ll.llama_token)), embd=None,
            pos=ctypes.cast(self.pos, ctypes.POINTER(ll.llama_pos)),
            n_seq_id=ctypes.cast(self.n_seq_id, ctypes.POINTER(ctypes.c_int32)),
            seq_id=ctypes.cast(self.seq_ptr, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id))),
            logits=ctypes.cast(self.logits, ctypes.POINTER(ctypes.c_int8)))
        self.n = 0


class Engine:
    def __init__(self, settings: wire.WorkerSettings) -> None:
        self.settings = settings
        self.m: LoadedModel = load_model(settings)
        self.info = self.m.info
        self.tok = Tokenizer(self.m)
        self.template: ChatTemplate | None = None
        self._template_error: str | None = None
        if not self.m.embedding:
            try:
                self.template = choose_template(
                    settings,
                    self.m.meta("tokenizer.chat_template"),
                    self.tok.special_text(ll.llama_vocab_bos(self.m.vocab)),
                    self.tok.special_text(ll.llama_vocab_eos(self.m.vocab)),
                )
            except TemplateError as exc:
                self._template_error = str(exc)
        self.prompts = PromptPreparer(self.tok, self.template, self._template_error, self.m.n_ctx_slot)
        self.slots = [_Slot(i) for i in range(self.m.n_slots)]
        self.waiting: deque[_Job] = deque()
        self.embed_waiting: deque[tuple[wire.EmbedRequest, float]] = deque()
        self.out: list[Outgoing] = []
        self._batch = _Batch(self.m.n_batch)
        self._by_id: dict[str, _Job] = {}
        self.tokens_generated = 0
        self.tokens_prompt = 0

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
                if not self.m.embedding:
                    raise RequestRejected(
                        "invalid_request", f"model {self.settings.model_id} does not serve embeddings"
                    )
                self.embed_waiting.append((req, time.perf_counter()))
                return
            if isinstance(req, wire.TokenizeRequest):
                self.out.append(requests.tokenize(self.tok, req))
                return
            if req.id in self._by_id:
                raise RequestRejected("invalid_request", f"request id {req.id!r} is already in use")
            if prepared is None:
                prepared = self.prepare(req)
            job = _Job(req, prepared.tokens, time.perf_counter())
            job.grammar = requests.grammar_sampler(self.m.vocab, prepared.gbnf)
            self._by_id[req.id] = job
            self.waiting.append(job)
        except RequestRejected as exc:
            self.out.append(wire.RequestFailed(req.id, exc.code, exc.message))
        except Exception as exc:  # noqa: BLE001 - no request may crash the worker
            log.exception("request %s failed on submit", req.id)
            self.out.append(wire.RequestFailed(req.id, "internal", f"{type(exc).__name__}: {exc}"))

    def abort(self, request_id: str) -> None:
        """Free the request's slot (or drop it from the queue) and answer Finished(abort)."""
        job = self._by_id.get(request_id)
        if job is None:
            return
        for slot in self.slots:
            if slot.job is job:
                self._finish(slot, "abort")
                return
        self.waiting.remove(job)
        del self._by_id[request_id]
        sampling.free_sampler(job.grammar)
        job.grammar = None
        self.out.append(
            wire.Finished(
                request_id,
                "abort",
                wire.Usage(len(job.tokens), 0, 0),
                wire.Timings(0.0, 0.0, 0.0, 0.0, (time.perf_counter() - job.t_submit) * 1000),
            )
        )

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.embed_waiting or any(s.busy for s in self.slots))

    def stats(self) -> wire.Stats:
        return wire.Stats(
            slots_busy=sum(1 for s in self.slots if s.busy),
            slots_total=len(self.slots),
            waiting=len(self.waiting) + len(self.embed_waiting),
            rss_bytes=rss_bytes(),
            model_bytes=self.info.model_bytes,
            kv_bytes=self.info.kv_bytes,
            tokens_generated=self.tokens_generated,
            tokens_prompt=self.tokens_prompt,
        )

    def set_threads(self, n: int) -> None:
        """Threads for the next decodes: the configured ones, or ``n`` for generation and
        prompt batches alike when fewer cores are free."""
        if n >= self.m.threads:
            ll.llama_set_n_threads(self.m.ctx, self.m.threads, self.m.threads_batch)
        else:
            ll.llama_set_n_threads(self.m.ctx, n, min(n, self.m.threads_batch))

    def close(self) -> None:
        for slot in self.slots:
            if slot.sampler is not None:
                slot.sampler.free()
                slot.sampler = None
        for job in self.waiting:
            sampling.free_sampler(job.grammar)
            job.grammar = None
        self.m.free()

    def fail_all(self, message: str) -> list[Outgoing]:
        """End every accepted request with RequestFailed(internal); the engine stays usable."""
        for slot in self.slots:
            if slot.job is not None:
                job = slot.job
                self._release(slot)
                self._clear_slot(slot)
                self.out.append(wire.RequestFailed(job.req.id, "internal", message))
        while self.waiting:
            job = self.waiting.popleft()
            self._by_id.pop(job.req.id, None)
            sampling.free_sampler(job.grammar)
            job.grammar = None
            self.out.append(wire.RequestFailed(job.req.id, "internal", message))
        while self.embed_waiting:
            req, _ = self.embed_waiting.popleft()
            self.out.append(wire.RequestFailed(req.id, "internal", message))
        return self.take_output()

    def take_output(self) -> list[Outgoing]:
        out, self.out = self.out, []
        return out

    # ------------------------------------------------------------------ prompt

    def prepare(self, req: wire.GenerateRequest) -> PreparedRequest:
        """Tokenize and check a request, and turn its schema into a grammar; RequestRejected
        if it cannot run. Thread-safe: the worker's reader thread calls it, so long prompts
        and schema conversion never stall ``step()``."""
        if self.m.embedding:
            raise RequestRejected("invalid_request",
                                  f"model {self.settings.model_id} is loaded for embeddings only")
        tokens = self.prompts.tokens(req)
        _check_params(req.params)
        requests.check_generation_fields(req, self.m.n_vocab)
        return PreparedRequest(req, tokens, requests.grammar_text(req))

    # ------------------------------------------------------------------ scheduling

    def _reuse_len(self, slot: _Slot, tokens: list[int]) -> int:
        """How many leading prompt tokens this slot's cache can serve, still valid.

        At most len(tokens) - 1: the last prompt token is always decoded, for its logits.
        With sliding-window attention the cache drops positions more than n_swa behind
        the newest one; reusing n tokens needs positions [n - n_swa, n) still present,
        i.e. seq_pos_min <= max(0, n - n_swa). Otherwise the prefix is not reused.
        """
        cached = slot.cached
        n = 0
        limit = min(len(cached), len(tokens) - 1)
        while n < limit and cached[n] == tokens[n]:
            n += 1
        if n == 0:
            return 0
        if self.m.n_swa > 0:
            pos_min = ll.llama_memory_seq_pos_min(self.m.memory, slot.index)
            if pos_min > max(0, n - self.m.n_swa):
                return 0
        return n

    def _admit(self) -> None:
        if not self.waiting:
            return
        free = [s for s in self.slots if not s.busy]
        while self.waiting and free:
            job = self.waiting.popleft()
            best, best_n = free[0], -1
            for s in free:
                n = self._reuse_len(s, job.tokens)
                if n > best_n or (n == best_n and len(s.cached) < len(best.cached)):
                    best, best_n = s, n
            free.remove(best)
            try:
                self._start(best, job, best_n)
            except Exception as exc:  # noqa: BLE001
                log.exception("request %s failed to start", job.req.id)
                self._by_id.pop(job.req.id, None)
                best.job = None
                self._clear_slot(best)
                self.out.append(wire.RequestFailed(job.req.id, "internal", f"{type(exc).__name__}: {exc}"))

    def _clear_slot(self, slot: _Slot) -> None:
        ll.llama_memory_seq_rm(self.m.memory, slot.index, -1, -1)
        slot.cached = []

    def _start(self, slot: _Slot, job: _Job, reuse: int) -> None:
        mem = self.m.memory
        req = job.req
        echo_lp = req.echo and req.logprobs is not None
        if echo_lp:
            reuse = 0  # every prompt token's logits are needed
        if reuse > 0 and ll.llama_memory_seq_rm(mem, slot.index, reuse, -1):
            del slot.cached[reuse:]
        else:
            reuse = 0
            self._clear_slot(slot)
        p = job.req.params
        slot.job = job
        slot.prompt_pos = reuse
        slot.n_cached = reuse
        slot.pending = -1
        slot.n_gen = 0
        room = self.m.n_ctx_slot - len(job.tokens)
        slot.max_tokens = room if p.max_tokens is None else min(p.max_tokens, room)
        grammar, job.grammar = job.grammar, None
        slot.sampler = sampling.SlotSampler(
            p,
            n_vocab=self.m.n_vocab,
            seed=sampling.resolve_seed(p, self.settings.seed),
            eog_tokens=self.tok.eog_tokens if p.ignore_eos else [],
            prompt_tail=job.tokens,
            grammar=grammar,
        )
        stops = list(p.stop)
        if req.messages is not None and self.template is not None and not p.ignore_eos and grammar is None:
            stops += [s for s in self.template.stop_strings if s not in stops]
        slot.out = SlotOutput(req.id, stops, requests.tool_parser(req))
        slot.ignore_eos = p.ignore_eos
        slot.logprobs = req.logprobs
        slot.echo_logprobs = [wire.TokenLogprob(self._special_piece(job.tokens[0]), None, [], job.tokens[0])] \
            if echo_lp else None
        slot.t_start = time.perf_counter()
        slot.t_first = 0.0
        if req.echo and not echo_lp:
            self.out.append(wire.Delta(req.id, requests.echo_text(self.tok, req, job.tokens), 0))
        if slot.max_tokens == 0 and not echo_lp:
            self._finish(slot, "length")

    def _special_piece(self, token: int) -> bytes:
        """A prompt token's bytes for echo; control tokens (BOS) by their text."""
        return self.tok.piece(token) or self.tok.special_text(token).encode("utf-8")

    # ------------------------------------------------------------------ the step

    def step(self) -> list[Outgoing]:
        """Run one decode over all busy slots; return the messages it produced."""
        if self.embed_waiting:
            self._run_embeddings()
        self._admit()
        b = self._batch
        n = 0
        outputs: list[tuple[_Slot, int]] = []
        echo_chunks: list[tuple[_Slot, int, int, int]] = []  # slot, batch index, prompt pos, count
        for slot in self.slots:
            if slot.job is not None and slot.pending >= 0:
                b.token[n] = slot.pending
                b.pos[n] = len(slot.cached)
                b.seq[n] = slot.index
                b.logits[n] = 1
                outputs.append((slot, n))
                slot.cached.append(slot.pending)
                slot.pending = -1
                n += 1
        budget = b.cap - n
        for slot in self.slots:
            if budget <= 0:
                break
            job = slot.job
            if job is None or slot.prompt_pos >= len(job.tokens) or slot.n_gen > 0:
                continue
            toks = job.tokens
            take = min(budget, len(toks) - slot.prompt_pos)
            echo = slot.echo_logprobs is not None
            if echo:
                take = min(take, _ECHO_CHUNK)
                echo_chunks.append((slot, n, slot.prompt_pos, take))
            start = len(slot.cached)
            for k in range(take):
                b.token[n + k] = toks[slot.prompt_pos + k]
                b.pos[n + k] = start + k
                b.seq[n + k] = slot.index
                b.logits[n + k] = 1 if echo else 0
            slot.cached.extend(toks[slot.prompt_pos : slot.prompt_pos + take])
            slot.prompt_pos += take
            n += take
            budget -= take
            if slot.prompt_pos == len(toks):
                b.logits[n - 1] = 1
                outputs.append((slot, n - 1))
        if n == 0:
            return self.take_output()
        b.batch.n_tokens = n
        rc = ll.llama_decode(self.m.ctx, b.batch)
        if rc != 0:
            self._decode_failed(rc)
            return self.take_output()
        for slot, at, pos, count in echo_chunks:
            self._prompt_logprobs(slot, at, pos, count)
        for slot, idx in outputs:
            if slot.job is not None:
                try:
                    self._sample(slot, idx)
                except Exception as exc:  # noqa: BLE001 - fail this request, not the worker
                    log.exception("sampling failed for %s", slot.job.req.id)
                    job = slot.job
                    self._release(slot)
                    self._clear_slot(slot)
                    self.out.append(wire.RequestFailed(job.req.id, "internal", f"{type(exc).__name__}: {exc}"))
        return self.take_output()

    def _decode_failed(self, rc: int) -> None:
        reason = "no room in the KV cache" if rc == 1 else f"llama_decode returned {rc}"
        log.error("decode failed: %s", reason)
        for slot in self.slots:
            if slot.job is not None:
                job = slot.job
                self._release(slot)
                self._clear_slot(slot)
                self.out.append(wire.RequestFailed(job.req.id, "internal", f"decode failed: {reason}"))

    def _prompt_logprobs(self, slot: _Slot, at: int, pos: int, count: int) -> None:
        """Logprobs of the prompt tokens after each of these positions (echo)."""
        job, lps = slot.job, slot.echo_logprobs
        assert job is not None and lps is not None
        toks = job.tokens
        k = slot.logprobs or 0
        for j in range(count):
            if pos + j + 1 < len(toks):
                nxt = toks[pos + j + 1]
                lps.append(sampling.token_logprobs(self._logits(at + j), nxt, k, self._special_piece))
        if pos + count == len(toks):
            self.out.append(wire.Delta(job.req.id, requests.echo_text(self.tok, job.req, toks), 0, lps))
            slot.echo_logprobs = None
            if slot.max_tokens == 0:
                self._finish(slot, "length")

    def _logits(self, idx: int) -> "sampling.Logits":
        return sampling.logits_at(self.m.ctx, idx, self.m.n_vocab)

    def _sample(self, slot: _Slot, idx: int) -> None:
        assert slot.sampler is not None and slot.out is not None and slot.job is not None
        tok = slot.sampler.sample(self.m.ctx, idx, self.tok.is_eog)
        now = time.perf_counter()
        if slot.n_gen == 0:
            slot.t_first = now
        if tok < 0:  # the grammar is complete and allows nothing more
            self._finish(slot, "stop")
            return
        slot.n_gen += 1
        self.tokens_generated += 1
        if not slot.ignore_eos and self.tok.is_eog(tok):
            self._finish(slot, "stop")
            return
        lp = None if slot.logprobs is None else \
            sampling.token_logprobs(self._logits(idx), tok, slot.logprobs, self.tok.piece)
        delta = slot.out.token(self.tok.piece(tok), lp)
        if delta is not None:
            self.out.append(delta)
        if slot.out.stopped:
            self._finish(slot, "stop")
        elif slot.n_gen >= slot.max_tokens:
            self._finish(slot, "length")
        else:
            slot.pending = tok

    def _finish(self, slot: _Slot, reason: wire.FinishReason) -> None:
        job = slot.job
        assert job is not None
        if reason != "abort" and slot.out is not None:
            delta = slot.out.finish()
            if delta is not None:
                self.out.append(delta)
        now = time.perf_counter()
        t_first = slot.t_first or now
        prompt_ms = (t_first - slot.t_start) * 1000
        predicted_ms = (now - t_first) * 1000
        n_prompt = len(job.tokens)
        n_eval = n_prompt - slot.n_cached
        self.tokens_prompt += n_eval
        self.out.append(
            wire.Finished(
                job.req.id,
                reason,
                wire.Usage(n_prompt, slot.n_gen, slot.n_cached),
                wire.Timings(
                    prompt_ms=prompt_ms,
                    predicted_ms=predicted_ms,
                    prompt_per_second=n_eval / (prompt_ms / 1000) if prompt_ms > 0 else 0.0,
                    predicted_per_second=(slot.n_gen - 1) / (predicted_ms / 1000)
                    if predicted_ms > 0 and slot.n_gen > 1
                    else 0.0,
                    queued_ms=(slot.t_start - job.t_submit) * 1000,
                    grammar_ms=slot.sampler.grammar_s * 1000 if slot.sampler is not None else 0.0,
                ),
                slot.index,
                stop_string=slot.out.stop.matched if slot.out is not None else None,
            )
        )
        self._release(slot)

    def _release(self, slot: _Slot) -> None:
        job = slot.job
        if job is not None:
            # ``cached`` matches the KV cache even mid-prefill (chunks are appended as
            # they are decoded), so what is there stays reusable.
            self._by_id.pop(job.req.id, None)
        slot.job = None
        slot.pending = -1
        if slot.sampler is not None:
            slot.sampler.free()
            slot.sampler = None
        slot.out = None
        slot.echo_logprobs = None

    # ------------------------------------------------------------------ embeddings

    def _run_embeddings(self) -> None:
        """Embedding requests run between generation steps, one request at a time."""
        req, _t_submit = self.embed_waiting.popleft()
        try:
            data, n_tokens = embed_batch(self.m, self.tok, req.inputs, req.normalize)
            self.out.append(wire.Embeddings(req.id, data, n_tokens))
            self.tokens_prompt += n_tokens
        except RequestRejected as exc:
            self.out.append(wire.RequestFailed(req.id, exc.code, exc.message))
        except Exception as exc:  # noqa: BLE001
            log.exception("embedding request %s failed", req.id)
            self.out.append(wire.RequestFailed(req.id, "internal", f"{type(exc).__name__}: {exc}"))
