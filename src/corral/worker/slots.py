"""The engine's per-slot and per-request records, the batch buffers, and the Finished
message a slot's end produces. Plain data; the engine owns the logic."""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import llama_cpp as ll

from corral import wire
from corral.worker import requests
from corral.worker.sampling import SlotSampler, logits_at, resolve_seed, token_logprobs
from corral.worker.slot_output import SlotOutput
from corral.worker.tokens import Tokenizer

__all__ = ["Job", "Slot", "Batch", "configure", "finished_message", "reuse_len", "echo_piece", "prompt_logprobs"]


@dataclass(eq=False)
class Job:
    req: wire.GenerateRequest
    tokens: list[int]
    t_submit: float
    grammar: ll.llama_sampler_p | None = None  # owned until a slot's sampler takes it


@dataclass(eq=False)
class Slot:
    index: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in the cache, in order
    job: Job | None = None
    prompt_pos: int = 0  # next prompt token to decode
    n_cached: int = 0  # prompt tokens reused from the cache
    pending: int = -1  # sampled token not yet decoded (GENERATE state)
    n_gen: int = 0
    max_tokens: int = 0
    sampler: SlotSampler | None = None
    out: SlotOutput | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per token; None: no logprobs
    echo_logprobs: list[wire.TokenLogprob] | None = None  # prompt logprobs being collected
    t_start: float = 0.0
    t_first: float = 0.0

    @property
    def busy(self) -> bool:
        return self.job is not None

    def reset(self) -> None:
        """Back to FREE. ``cached`` stays: it matches the KV cache even mid-prefill (chunks
        are appended as they are decoded), so what is there stays reusable."""
        self.job = None
        self.pending = -1
        if self.sampler is not None:
            self.sampler.free()
            self.sampler = None
        self.out = None
        self.echo_logprobs = None


class Batch:
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



def finished_message(slot: Slot, job: Job, reason: wire.FinishReason) -> wire.Finished:
    now = time.perf_counter()
    t_first = slot.t_first or now
    prompt_ms = (t_first - slot.t_start) * 1000
    predicted_ms = (now - t_first) * 1000
    n_prompt = len(job.tokens)
    n_eval = n_prompt - slot.n_cached
    return wire.Finished(
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


def reuse_len(slot: Slot, tokens: list[int], memory: ll.llama_memory_t, n_swa: int) -> int:
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
    if n_swa > 0:
        pos_min = ll.llama_memory_seq_pos_min(memory, slot.index)
        if pos_min > max(0, n - n_swa):
            return 0
    return n


def echo_piece(tok: Tokenizer, token: int) -> bytes:
    """A prompt token's bytes for echo; control tokens (BOS) by their text."""
    return tok.piece(token) or tok.special_text(token).encode("utf-8")


def prompt_logprobs(slot: Slot, ctx: ll.llama_context_p, tok: Tokenizer, at: int, pos: int,
                    count: int) -> wire.Delta | None:
    """Collect the logprobs of the prompt tokens that follow positions ``pos..pos+count``
    (decoded at batch indices ``at..``); once the prompt is complete, the echo Delta."""
    job, lps = slot.job, slot.echo_logprobs
    assert job is not None and lps is not None
    toks = job.tokens
    k = slot.logprobs or 0
    for j in range(count):
        if pos + j + 1 < len(toks):
            logits = logits_at(ctx, at + j, tok.n_vocab)
            lps.append(token_logprobs(logits, toks[pos + j + 1], k, lambda t: echo_piece(tok, t)))
    if pos + count < len(toks):
        return None
    slot.echo_logprobs = None
    return wire.Delta(job.req.id, requests.echo_text(tok, job.req, toks), 0, lps)


def configure(slot: Slot, job: Job, reuse: int, *, n_ctx_slot: int, tok: Tokenizer, seed: int | None,
              template_stops: tuple[str, ...]) -> None:
    """Set a slot up for ``job`` (its first ``reuse`` prompt tokens are cached): sampler
    (taking the job's grammar), output pipeline, limits. ``template_stops``: the chat
    template's end-of-turn strings (not used under a grammar, which decides the end)."""
    req = job.req
    p = req.params
    slot.job = job
    slot.prompt_pos = reuse
    slot.n_cached = reuse
    slot.pending = -1
    slot.n_gen = 0
    room = n_ctx_slot - len(job.tokens)
    slot.max_tokens = room if p.max_tokens is None else min(p.max_tokens, room)
    grammar, job.grammar = job.grammar, None
    slot.sampler = SlotSampler(p, n_vocab=tok.n_vocab, seed=resolve_seed(p, seed),
                               eog_tokens=tok.eog_tokens if p.ignore_eos else [], prompt_tail=job.tokens,
                               grammar=grammar)
    stops = list(p.stop)
    if not p.ignore_eos and grammar is None:
        stops += [s for s in template_stops if s not in stops]
    slot.out = SlotOutput(req.id, stops, requests.tool_parser(req))
    slot.ignore_eos = p.ignore_eos
    slot.logprobs = req.logprobs
    echo_lp = req.echo and req.logprobs is not None
    slot.echo_logprobs = [wire.TokenLogprob(echo_piece(tok, job.tokens[0]), None, [], job.tokens[0])] \
        if echo_lp else None
    slot.t_start = time.perf_counter()
    slot.t_first = 0.0
