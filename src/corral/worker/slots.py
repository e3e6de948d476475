"""A slot's state, the step features that run on it, and the messages a slot's end produces: the plain data the engine (``corral.worker.engine``) works on.

The step-feature interface (``StepFeature``): what a per-request feature of the step implements.

A feature (a time limit, speculation, reasoning, LoRA, vision, ...) is a ``StepFeature``
subclass in its own folder under ``corral/worker/`` that overrides the moments it needs;
the others are no-ops. The engine (``corral.worker.engine``) holds the features the model's
settings turn on (``Engine.features``; a feature turned off is not in the list, so it costs
nothing), and each slot holds the features its request uses (``Slot.features``, chosen at
``admitted``): the per-token moments run only for those, so a request that does not use a
feature never pays for it either.

    moment            when, on which thread                         what it may do
    admitted          a job has just taken a slot (engine thread)   set its state on the slot; True: run for it
    before_admit      before the queue's jobs take free slots       its own first (a paused job resuming)
    before_batch      before the step's batch is built (engine)     narrow the slots that fill it this step
    write_decodes *   the generating slots' tokens into the batch   their drafts too (speculation)
    decode *          the step's ``llama_decode``                   abort it, undone (preemption's urgent starts)
    idle              the step had nothing to decode (engine)       wait for work in flight (an image)
    after_logits      a slot's logits are ready (a sampling thread) force a token instead of the draw
    draws             then (the same thread)                        draw at several positions (a draft's)
    end_of_generation the slot drew an end-of-generation token      a token to take instead (else: stop)
    token_accepted    a drawn token went into the output (engine)   end the request ("stop", "length")
    taken             the slot's drawn tokens were all taken        settle (a rejected draft out of the KV)
    paused            the slot's request is paused (preemption)     drop what is not on the slot
    resumed           it resumes, maybe into another slot           rebuild what is not on the slot
    finished          the request ended, before the slot is freed   free what it holds, count it
    abort / fail_all  a request (every one) ends, not on a slot     end those the feature holds (paused ones)
    has_work / close  is work waiting / the engine closes           say so / free what the feature holds

``*``: at most one feature of an engine implements it (``owner``); else the engine's plain path
(``prefill.write_pending``: each slot's pending token; ``Batch.decode``), so with speculation
off no speculation code runs in a step.

A feature's per-slot state is ONE typed field of ``Slot`` (``corral.worker.slots``), named
after the feature and ``None`` (or its empty value) while no request uses it. Pausing copies a
slot's request fields (every field but the cell fields, ``slots.CELL_FIELDS``) into the
paused job and back into the slot it resumes in, and the prompt cache keys a slot's cells by
its cell fields: a feature whose state is on the slot is carried by both without a line of
its own. Only a feature that keeps state outside the slot (a second context's sequence)
needs ``paused``/``resumed``.

The recipe ("adding a step feature", docs/architecture.md): a folder
``corral/worker/<feature>/`` with the subclass, its state's field on ``Slot``, one line in
``features.step_features``, its modules on a floor of ``WORKER_FLOORS`` (tests/test_layout.py:
a state below this module, the feature above it), the request field in ``corral.wire`` (and the
dialects that take it), a test in ``tests/worker/``. No other feature's files change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, cast

import llama_cpp as ll

from corral import wire
from corral.worker.batch import Batch
from corral.worker.sampling import sampler as sampling
from corral.worker.sampling.pool import Drawn
from corral.worker.failures import RequestRejected
from corral.worker.lora.state import BASE, LoraKey
from corral.worker.media.prompt import kv_pos, reuse_cut
from corral.worker.model import LoadedModel
from corral.worker.reasoning.plan import ReasoningPlan, SlotReasoning
from corral.worker.output.infill import slot_output
from corral.worker.output.slot_output import SlotOutput
from corral.worker.prompt.requests import tool_parser
from corral.worker.tokens import Tokenizer
from corral.worker.speculation.state import SlotSpec
from corral.worker.time_limit.state import TimeLimit

__all__ = ["CELL_FIELDS", "Job", "Slot", "StepFeature", "begin", "check_params", "finished_message", "keep_prefix", "release", "reuse_len",
           "aborted_in_queue", "equip", "free_samplers", "overrides", "owner", "pick_slot", "slot_states"]

C = TypeVar("C", bound=Callable[..., Any])


@dataclass(eq=False)
class Job:
    req: wire.GenerateRequest
    tokens: list[int]
    t_submit: float
    grammar: ll.llama_sampler_p | None = None  # owned until a slot's sampler takes it
    reasoning: ReasoningPlan | None = None  # how its thinking runs (worker/reasoning/plan.py)
    lora: LoraKey = BASE  # the adapter set it runs with (worker/lora/adapters.py)
    cuts: tuple[int, ...] = ()  # where its prompt's chunks stop, before its end (prefill.prompt_cuts)

    @property
    def tail(self) -> int:
        """Prompt tokens a reused prefix leaves to decode: the last cut (``LAST_CUT``), else 1."""
        return self.cuts[-1] if self.cuts else 1


@dataclass(eq=False)
class Slot:
    index: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV is in the cache, in order
    tenant: str = ""  # the cache tenant whose requests computed those cells: only its jobs reuse them
    lora: LoraKey = BASE  # the LoRA adapter set those cells were computed under: only its jobs reuse them
    job: Job | None = None
    prompt_pos: int = 0  # next prompt token to decode
    n_cached: int = 0  # prompt tokens reused from the cache
    pending: int = -1  # sampled token not yet decoded (GENERATE state)
    n_gen: int = 0
    max_tokens: int = 0
    sampler: sampling.Sampler | None = None
    out: SlotOutput | None = None
    reasoning: SlotReasoning | None = None  # the thinking's split, budget and forced tokens
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives per token; None: no logprobs
    echo_logprobs: list[wire.TokenLogprob] | None = None  # prompt logprobs being collected
    t_start: float = 0.0
    t_first: float = 0.0
    features: tuple[StepFeature, ...] = ()  # the engine's features this slot's request uses
    # one field a feature: its state while the slot's request uses it
    spec: SlotSpec = field(default_factory=SlotSpec)  # its drafts (worker/speculation/; off: on=False)
    time_limit: TimeLimit | None = None  # t_max_predict_ms (worker/time_limit/)

    @property
    def busy(self) -> bool:
        return self.job is not None


# a slot's cell fields: its KV cells and what they were computed under; every other field is
# the request's, and moves with it when it is paused (worker/preempt/preemption.py)
CELL_FIELDS = ("index", "cached", "tenant", "lora")
# a completion's prompt on a sliding-window model ends in a chunk of this many tokens
# (worker/prefill.py: llama-server's cut); a reused prefix stops where it began, so those
# tokens decode again in the batch shape they had and the answer is the fresh prefill's
LAST_CUT = 4


class StepFeature:
    """One per-request feature of the step; every moment is a no-op until overridden."""

    name: ClassVar[str]  # the feature's folder, and the name its state has on ``Slot``

    def admitted(self, slot: Slot, job: Job) -> bool:
        """``job`` has taken ``slot`` (its counters reset; its sampler and output are made
        next, so a feature may take ``job.grammar``: the sampler then starts without it);
        set the feature's state on the slot. True: the slot runs this feature's per-slot
        moments (it joins ``slot.features``)."""
        return False

    def before_admit(self) -> None:
        """Before the queue's jobs take the free slots: this feature's own take them first."""

    def before_batch(self, slots: list[Slot]) -> list[Slot]:
        """The slots that fill this step's batch, out of ``slots`` (every feature of the engine,
        in order; the next one sees what this one returns)."""
        return slots

    def write_decodes(self, b: Batch, slots: list[Slot]) -> tuple[int, list[tuple[Slot, int]]]:
        """Write each generating slot of ``slots`` (its ``pending`` token) at the batch's start;
        the count and each (slot, batch index of its first logits). One feature at most."""
        raise NotImplementedError

    def decode(self, b: Batch, n: int, outputs: list[tuple[Slot, int]], echo_chunks: list[Any]) -> int:
        """The step's decode of ``n`` tokens: llama.cpp's code (0: done; 0 with ``outputs`` and
        ``echo_chunks`` emptied: undone, nothing to draw). One feature at most."""
        raise NotImplementedError

    def idle(self) -> None:
        """The step had nothing to decode (work of this feature's may still be in flight)."""

    def after_logits(self, slot: Slot) -> int | None:
        """On a sampling thread, touching only ``slot``: a token to take instead of the
        draw (None: draw as usual)."""
        return None

    def draws(self, slot: Slot, first: int, draw: Callable[[int], Drawn]) -> list[Drawn] | None:
        """On that thread: the slot's draws (``draw(i)``: at batch index ``i``) from ``first``,
        its logits' index, on (None: the one draw there)."""
        return None

    def end_of_generation(self, slot: Slot) -> int | None:
        """The slot drew an end-of-generation token (and does not ignore it): a token to
        take instead (None: the request ends with ``stop``)."""
        return None

    def token_accepted(self, slot: Slot, token: int, delta: wire.Delta | None) -> wire.FinishReason | None:
        """``token`` (and the text it released, ``delta``) went into the slot's output; a
        reason ends the request with it (None: go on)."""
        return None

    def taken(self, slot: Slot, job: Job, drawn: list[Drawn]) -> None:
        """``job``'s tokens ``drawn`` this step were taken (it may have ended: then the slot is free)."""

    def paused(self, slot: Slot) -> None:
        """The slot's request is being paused; its request fields move with it."""

    def resumed(self, slot: Slot) -> None:
        """A paused request's fields are in ``slot`` again (maybe not the slot it left)."""

    def finished(self, slot: Slot, fin: wire.Finished) -> None:
        """The slot's request ended with ``fin`` (sent next); the slot is freed after."""

    def abort(self, request_id: str) -> bool:
        """An Abort of a request on no slot and not queued: True when this feature held it (it answered)."""
        return False

    def fail_all(self, message: str) -> None:
        """The engine fails every request: end those this feature holds with RequestFailed."""

    def has_work(self) -> bool:
        """Work of this feature's waits for a step (a paused request to resume)."""
        return False

    def close(self) -> None:
        """The engine closes: free what the feature holds."""


def overrides(feature: StepFeature, moment: str) -> bool:
    """Whether ``feature`` implements ``moment`` (the engine runs an engine-wide moment only
    for the features that do)."""
    return getattr(type(feature), moment) is not getattr(StepFeature, moment)


def owner(features: Iterable[StepFeature], moment: str, plain: C) -> C:
    """The one feature's ``moment`` (a moment marked ``*``), else ``plain``."""
    found = [f for f in features if overrides(f, moment)]
    assert len(found) <= 1, f"{moment}: more than one feature implements it"
    return cast(C, getattr(found[0], moment)) if found else plain


def begin(slot: Slot, job: Job, reuse: int, room: int, now: float, default_max: int | None = None) -> None:
    """Reset ``slot`` for ``job``, whose first ``reuse`` prompt tokens are in its cache and
    which has ``room`` cells left after the prompt; ``default_max``: the model's limit for a
    request that sets none."""
    p = job.req.params
    if job.req.token_budget is not None:  # the key's reservation bounds prompt + completion
        room = min(room, max(0, job.req.token_budget - len(job.tokens)))
    slot.job = job
    slot.prompt_pos = reuse
    slot.n_cached = reuse
    slot.pending = -1
    slot.n_gen = 0
    limit = p.max_tokens if p.max_tokens is not None else default_max
    slot.max_tokens = room if limit is None else min(limit, room)
    slot.ignore_eos = p.ignore_eos
    slot.logprobs = job.req.logprobs
    slot.t_start = now
    slot.t_first = 0.0


def equip(slot: Slot, job: Job, grammar: ll.llama_sampler_p | None, tok: Tokenizer, *, default_seed: int | None,
          template_stops: Iterable[str] = ()) -> None:
    """Give ``slot`` (``begin`` done, the step features admitted) the sampler ``job`` draws
    with, which owns ``grammar``, and its output (``template_stops``: the chat template's)."""
    p = job.req.params
    slot.sampler = sampling.slot_sampler(p, n_vocab=tok.n_vocab, seed=sampling.resolve_seed(p, default_seed),
                                         eog_tokens=tok.eog_tokens if p.ignore_eos else [],
                                         prompt_tail=job.tokens, grammar=grammar)
    slot.out = slot_output(job.req, list(p.stop), tool_parser(job.req), template_stops=list(template_stops),
                           reasoning=slot.reasoning)


def check_params(p: wire.SamplingParams) -> None:
    """The bounds the router checks too (``wire.invalid_field``): one set for both."""
    bad = wire.invalid_field(p)
    if bad is not None:
        raise RequestRejected("invalid_request", f"{bad[0]}: {bad[1]}")


def finished_message(slot: Slot, job: Job, reason: wire.FinishReason, now: float) -> wire.Finished:
    """The ``Finished`` that ends ``job`` on ``slot`` (usage and timings)."""
    t_first = slot.t_first or now
    prompt_ms = (t_first - slot.t_start) * 1000
    predicted_ms = (now - t_first) * 1000
    n_prompt = len(job.tokens)
    n_eval = n_prompt - slot.n_cached
    return wire.Finished(
        job.req.id,
        reason,
        wire.Usage(n_prompt, slot.n_gen, slot.n_cached, slot.reasoning.n_tokens if slot.reasoning else 0),
        wire.Timings(
            prompt_ms=prompt_ms,
            predicted_ms=predicted_ms,
            prompt_per_second=n_eval / (prompt_ms / 1000) if prompt_ms > 0 else 0.0,
            predicted_per_second=(slot.n_gen - 1) / (predicted_ms / 1000)
            if predicted_ms > 0 and slot.n_gen > 1 else 0.0,
            queued_ms=(slot.t_start - job.t_submit) * 1000,
            grammar_ms=slot.sampler.grammar_s * 1000 if isinstance(slot.sampler, sampling.GrammarSampler) else 0.0,
        ),
        slot.index,
        stop_string=slot.out.stop.matched if slot.out is not None else None,
        reasoning_budget=slot.reasoning.budget if slot.reasoning is not None else None,
    )


def release(slot: Slot) -> None:
    """The slot is free again. ``cached`` matches the KV cache even mid-prefill (chunks
    are appended as they are decoded), so what is there stays reusable."""
    slot.job = None
    slot.pending = -1
    slot.features = ()
    if slot.sampler is not None:
        slot.sampler.free()
        slot.sampler = None
    slot.out = None
    slot.echo_logprobs = None
    if slot.reasoning is not None:
        slot.reasoning.free()
        slot.reasoning = None


def reuse_len(slot: Slot, tokens: list[int], m: LoadedModel, tail: int = 1) -> int:
    """How many leading prompt tokens this slot's cache can serve, still valid.

    At most len(tokens) - tail: the last prompt token is always decoded, for its logits
    (``Job.tail``: a completion's last cut, on a sliding-window model).
    With sliding-window attention the cache drops positions more than n_swa behind
    the newest one; reusing n tokens needs positions [n - n_swa, n) still present,
    i.e. seq_pos_min <= max(0, n - n_swa). Otherwise the prefix is not reused.
    """
    cached = slot.cached
    n = 0
    limit = min(len(cached), len(tokens) - tail)
    while n < limit and cached[n] == tokens[n]:
        n += 1
    if n == 0:
        return 0
    if m.n_swa > 0:
        pos_min = ll.llama_memory_seq_pos_min(m.memory, slot.index)
        if pos_min > max(0, n - m.n_swa):
            return 0
    return n


def keep_prefix(slot: Slot, tokens: list[int], reuse: int, m: LoadedModel) -> int:
    """Cut ``slot``'s cells to its first ``reuse`` entries, which are ``tokens``' (cut back to
    whole media chunks: ``media.prompt.reuse_cut``; at their KV position, ``kv_pos``); every
    cell goes where none is kept or llama.cpp cannot cut there. Returns the entries kept."""
    reuse = reuse_cut(tokens, reuse)
    if reuse > 0 and ll.llama_memory_seq_rm(m.memory, slot.index, kv_pos(tokens, reuse), -1):
        del slot.cached[reuse:]
        return reuse
    ll.llama_memory_seq_rm(m.memory, slot.index, -1, -1)
    slot.cached = []
    return 0


def pick_slot(free: list[Slot], tokens: list[int], m: LoadedModel, tenant: str = "",
              lora: LoraKey = BASE, tail: int = 1) -> tuple[Slot, int]:
    """The free slot whose cache serves the longest valid prefix of ``tokens`` (ties:
    the shortest cache), and that prefix's length. Only a slot whose cells are of cache
    tenant ``tenant`` and adapter set ``lora`` serves a prefix (any other slot's cells
    serve 0: they are cleared, or saved first, when the job starts there). The slot's
    cell fields are not changed here (``PromptCache.admit`` does, after saving the old cells)."""
    best, best_n = free[0], -1
    for s in free:
        n = reuse_len(s, tokens, m, tail) if s.tenant == tenant and s.lora == lora else 0
        if n > best_n or (n == best_n and len(s.cached) < len(best.cached)):
            best, best_n = s, n
    return best, max(0, best_n)


def aborted_in_queue(job: Job, now: float) -> wire.Finished:
    """``Finished(abort)`` for a request aborted before it had a slot."""
    return wire.Finished(job.req.id, "abort", wire.Usage(len(job.tokens), 0, 0),
                         wire.Timings(0.0, 0.0, 0.0, 0.0, (now - job.t_submit) * 1000))


def free_samplers(slots: Iterable[Slot], waiting: Iterable[Job]) -> None:
    """Free every sampler the slots and the queued jobs hold (the engine closes)."""
    for slot in slots:
        if slot.sampler is not None:
            slot.sampler.free()
            slot.sampler = None
        if slot.reasoning is not None:
            slot.reasoning.free()
    for job in waiting:
        sampling.free_sampler(job.grammar)
        job.grammar = None


def slot_states(slots: Iterable[Slot], n_ctx: int) -> list[wire.SlotState]:
    """Each slot as ``GET /slots`` shows it."""
    out = []
    for s in slots:
        job = s.job
        if job is None:
            out.append(wire.SlotState(id=s.index, n_ctx=n_ctx, is_processing=False, n_cached=len(s.cached)))
            continue
        out.append(wire.SlotState(id=s.index, n_ctx=n_ctx, is_processing=True, request_id=job.req.id,
                                  n_prompt_tokens=len(job.tokens), n_prompt_tokens_cache=s.n_cached,
                                  n_decoded=s.n_gen, n_remain=max(0, s.max_tokens - s.n_gen),
                                  n_cached=len(s.cached)))
    return out
