"""The engine's reasoning hooks (worker/engine.py calls these; the logic is in
worker/reasoning.py and worker/split.py):

- ``prepare``: the request's thinking (on/off, budget), the template variables, the
  rendered prompt's tokens and the plan;
- ``start``: a slot's ``SlotReasoning`` (which holds a grammar back until the answer);
- ``forced``: on the sampling thread, the token the worker forces instead of a draw;
- ``piece``: a token's text, tag tokens included (control tokens such as gpt-oss's
  ``<|channel|>`` render as nothing otherwise);
- ``after_token``: once the answer starts, the slot samples with its grammar.
"""

from __future__ import annotations

import llama_cpp as ll

from corral import reasoning_format, wire
from corral.worker import reasoning, sampling
from corral.worker.failures import RequestRejected
from corral.worker.prompts import PromptPreparer
from corral.worker.slots import Job, Slot
from corral.worker.templates import ChatTemplate
from corral.worker.tokens import Tokenizer

__all__ = ["EngineReasoning"]

_HARMONY_TOKENS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>",
                   "<|return|>")
_HARMONY_REOPEN = "<|start|>assistant<|channel|>final<|message|>"


class EngineReasoning:
    def __init__(self, settings: wire.WorkerSettings, template: ChatTemplate | None, tok: Tokenizer,
                 fmt_name: str) -> None:
        self.settings = settings
        self.tok = tok
        self.source = template.source if template is not None else ""
        self.fmt = reasoning_format.FORMATS.get(fmt_name)
        self.tag_pieces: dict[int, bytes] = {}
        self.close: list[int] = []
        self.reopen: list[int] = []
        if self.fmt is None:
            return
        harmony = self.fmt.name == reasoning_format.HARMONY
        for tag in (self.fmt.open, self.fmt.close, *(_HARMONY_TOKENS if harmony else ())):
            ids = tok.tokenize(tag, add_special=False, parse_special=True)
            if len(ids) == 1 and not tok.piece(ids[0]):
                self.tag_pieces[ids[0]] = tok.special_text(ids[0]).encode("utf-8")
        self.close = self._tokens(self.fmt.close)
        self.reopen = self._tokens(_HARMONY_REOPEN) if harmony else []

    def _tokens(self, text: str) -> list[int]:
        return self.tok.tokenize(text, add_special=False, parse_special=True) if text else []

    def prepare(self, req: wire.GenerateRequest, prompts: PromptPreparer
                ) -> tuple[list[int], reasoning.ReasoningPlan | None]:
        if req.messages is None:  # a raw prompt: no template, no split
            if req.think:
                raise RequestRejected("invalid_request", "think: thinking is split from chat messages only, "
                                                         "not from a raw prompt")
            return prompts.tokens_text(req)[0], None
        t = reasoning.wanted(self.fmt, self.settings, req)
        tokens, text = prompts.tokens_text(req, reasoning.template_vars(t, req, self.source))
        if t is None or self.fmt is None or text is None:
            return tokens, None
        return tokens, reasoning.plan(self.fmt, t, text)

    def start(self, slot: Slot, job: Job, grammar: ll.llama_sampler_p | None) -> ll.llama_sampler_p | None:
        """Set the slot's reasoning; returns the grammar the sampler starts with."""
        p = job.reasoning
        if p is None:
            return grammar
        held = grammar if (p.prefix or p.initial != "answer") else None
        slot.reasoning = reasoning.SlotReasoning(p, self._tokens(p.prefix), self.close, self.reopen, held)
        return None if held is not None else grammar

    @staticmethod
    def forced(slot: Slot) -> int | None:
        return slot.reasoning.next_forced() if slot.reasoning is not None else None

    @staticmethod
    def instead_of_eog(slot: Slot) -> int:
        """The token that replaces an end-of-generation one (the thinking's close), or -1:
        the request ends."""
        r = slot.reasoning.replace_eog() if slot.reasoning is not None else None
        return -1 if r is None else r

    def piece(self, slot: Slot, token: int) -> bytes:
        """The token's bytes; a tag's control token has its text for a slot that splits."""
        return self.tok.piece(token) or (self.tag_pieces.get(token, b"") if slot.reasoning is not None else b"")

    def after_token(self, slot: Slot, n_vocab: int) -> None:
        """The answer has started: the held grammar goes into a new sampler."""
        r, job = slot.reasoning, slot.job
        grammar = r.take_grammar() if r is not None else None
        if grammar is None or job is None:
            return
        p = job.req.params
        old = slot.sampler
        slot.sampler = sampling.slot_sampler(
            p, n_vocab=n_vocab, seed=sampling.resolve_seed(p, self.settings.seed),
            eog_tokens=self.tok.eog_tokens if p.ignore_eos else [], prompt_tail=list(slot.cached), grammar=grammar)
        if old is not None:
            old.free()
