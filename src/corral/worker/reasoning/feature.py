"""Reasoning as a step feature (``StepFeature``, worker/slots.py; the logic is in
worker/reasoning/plan.py and worker/reasoning/split.py). Its per-slot state is ``Slot.reasoning``
(``SlotReasoning``), so pausing and resuming carry it.

- ``prompt`` (at prepare, the reader thread): the request's thinking (on/off, budget), the
  template variables, the rendered prompt's tokens and the plan;
- ``admitted``: a slot's ``SlotReasoning`` for a job with a plan (it takes the job's grammar
  and holds it back until the answer), with the tag tokens' text (control tokens such as
  gpt-oss's ``<|channel|>`` render as nothing otherwise; ``SlotOutput.token``);
- ``after_logits``: on the sampling thread, the token the worker forces instead of a draw;
- ``end_of_generation``: inside the thinking, the close instead of the end;
- ``token_accepted``: once the answer starts, the slot samples with its grammar.

The engine lists it only for a model with a reasoning format; a slot joins it only when its
request has a plan, so a request without thinking pays nothing per token.
"""

from __future__ import annotations

from corral import wire

from corral.model import reasoning_format
from corral.worker.reasoning import plan as reasoning
from corral.worker.sampling import sampler as sampling
from corral.worker.prompt.prompts import PromptPreparer
from corral.worker.slots import Job, Slot, StepFeature
from corral.worker.prompt.templates import ChatTemplate
from corral.worker.tokens import Tokenizer

__all__ = ["ReasoningFeature"]

_HARMONY_TOKENS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>",
                   "<|return|>")
_HARMONY_REOPEN = "<|start|>assistant<|channel|>final<|message|>"


class ReasoningFeature(StepFeature):

    def __init__(self, settings: wire.WorkerSettings, template: ChatTemplate | None, tok: Tokenizer,
                 fmt_name: str, n_vocab: int = 0) -> None:
        self.settings = settings
        self.tok = tok
        self.n_vocab = n_vocab
        self.source = template.source if template is not None else ""
        self.fmt = reasoning_format.FORMATS.get(fmt_name)
        self.tag_pieces: dict[int, bytes] = {}
        self.close_ids: list[int] = []
        self.reopen: list[int] = []
        if self.fmt is None:
            return
        harmony = self.fmt.name == reasoning_format.HARMONY
        for tag in (self.fmt.open, self.fmt.close, *(_HARMONY_TOKENS if harmony else ())):
            ids = tok.tokenize(tag, add_special=False, parse_special=True)
            if len(ids) == 1 and not tok.piece(ids[0]):
                self.tag_pieces[ids[0]] = tok.special_text(ids[0]).encode("utf-8")
        self.close_ids = self._tokens(self.fmt.close)
        self.reopen = self._tokens(_HARMONY_REOPEN) if harmony else []

    def _tokens(self, text: str) -> list[int]:
        return self.tok.tokenize(text, add_special=False, parse_special=True) if text else []

    def prompt(self, req: wire.GenerateRequest, prompts: PromptPreparer
               ) -> tuple[list[int], reasoning.ReasoningPlan | None]:
        if req.messages is None:  # a raw prompt: no template, no split
            reasoning.refuse_thinking(self.settings, req)
            return prompts.tokens_text(req)[0], None
        t = reasoning.wanted(self.fmt, self.settings, req)
        tokens, text = prompts.tokens_text(req, reasoning.template_vars(t, req, self.source))
        if t is None or self.fmt is None or text is None:
            return tokens, None
        return tokens, reasoning.plan(self.fmt, t, text)

    @property
    def on(self) -> bool:
        """The model has a reasoning format (else no request has a plan)."""
        return self.fmt is not None

    def admitted(self, slot: Slot, job: Job) -> bool:
        """A job with a plan: the slot's split; it holds the job's grammar until the answer."""
        p = job.reasoning
        if p is None:
            return False
        held = None
        if job.grammar is not None and (p.prefix or p.initial != "answer"):
            held, job.grammar = job.grammar, None
        slot.reasoning = reasoning.SlotReasoning(p, self._tokens(p.prefix), self.close_ids, self.reopen, held,
                                                 tag_pieces=self.tag_pieces)
        return True

    def after_logits(self, slot: Slot) -> int | None:
        return slot.reasoning.next_forced() if slot.reasoning is not None else None

    def end_of_generation(self, slot: Slot) -> int | None:
        """The thinking's close instead of an end inside it (None: the request ends)."""
        return slot.reasoning.replace_eog() if slot.reasoning is not None else None

    def token_accepted(self, slot: Slot, token: int, delta: wire.Delta | None) -> wire.FinishReason | None:
        """The answer has started: the held grammar goes into a new sampler."""
        r, job = slot.reasoning, slot.job
        grammar = r.take_grammar() if r is not None else None
        if grammar is None or job is None:
            return None
        p = job.req.params.values()
        old = slot.sampler
        slot.sampler = sampling.slot_sampler(
            p, n_vocab=self.n_vocab, seed=sampling.resolve_seed(p),
            eog_tokens=self.tok.eog_tokens if p.ignore_eos else [], prompt_tail=list(slot.cached), grammar=grammar,
            dry=sampling.Dry(self.tok.vocab, len(slot.cached) + slot.max_tokens))
        if old is not None:
            old.free()
        return None
