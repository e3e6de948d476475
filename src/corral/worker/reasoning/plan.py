"""Reasoning in the worker's step: what a request asks (thinking on or off, its budget),
how the prompt left the thinking (opened, closed, neither), and per slot the split of
each generated piece (``worker/reasoning/split.py``), the budget and the tokens the worker forces.

At prepare (``wanted`` -> template variables -> ``plan``):

- the request's ``think`` / ``thinking_budget`` / ``reasoning_effort`` /
  ``template_kwargs["enable_thinking"]`` with the model's ``reasoning_budget`` (default),
  ``reasoning_budget_max`` (cap) and ``reasoning_levels`` (effort -> budget) give
  (on, budget). A budget below 0 or above the cap, an unknown level, or thinking asked of
  a model without a reasoning format is refused (``RequestRejected``), except for a request
  whose thinking is ``thinking_optional`` (Anthropic's): ignored by a model that cannot think,
  a budget above the cap clamped to it (``Finished.reasoning_budget`` says what it ran with).
- templates that take ``enable_thinking`` (Qwen3) or ``reasoning_effort`` (gpt-oss) get
  them; then the rendered prompt says where generation starts: inside the thinking (the
  template opened it), after it (the template closed it) or before it.
- thinking on but not opened: the worker forces the open tag as the first tokens;
  thinking off but opened: it forces the close; off and neither: the empty block
  (``<think>\\n\\n</think>\\n\\n``; harmony: the final channel's header). So the model
  never thinks when told not to, and the split's state is always known.

Per slot (``SlotReasoning``): every token drawn while the splitter is inside the thinking
counts against the budget; when it is spent the close sequence is queued and the engine
draws those tokens instead of sampling (``next_forced``); an end-of-generation token
inside the thinking is replaced by the close too (the answer follows, never an empty
one). A grammar (JSON schema, forced tool call) is held back until the answer starts, so
it constrains the answer and not the thinking.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.model.reasoning_format import HARMONY, ReasoningFormat
from corral.worker.failures import RequestRejected
from corral.worker.reasoning.split import HarmonySplitter, Splitter, TagSplitter

__all__ = ["Thinking", "ReasoningPlan", "SlotReasoning", "wanted", "template_vars", "plan"]

_HARMONY_LEVELS = ("low", "medium", "high")


@dataclass(frozen=True)
class Thinking:
    on: bool
    budget: int  # -1: unlimited
    effort: str | None = None


@dataclass(frozen=True)
class ReasoningPlan:
    fmt: ReasoningFormat
    initial: str  # the splitter's state after the prompt: start | reasoning | answer
    prefix: str  # forced as the first generated tokens ("" none)
    budget: int  # -1: unlimited


def wanted(fmt: ReasoningFormat | None, s: wire.WorkerSettings, req: wire.GenerateRequest) -> Thinking | None:
    """What the request asks, within the model's settings; None: no reasoning split."""
    kw = req.template_kwargs or {}
    enable = kw.get("enable_thinking")
    budget = req.thinking_budget
    effort = req.reasoning_effort
    cap = s.reasoning_budget_max
    if budget is not None and budget < 0:
        raise RequestRejected("invalid_request", f"thinking_budget_tokens: {budget} is below 0")
    if budget is not None and cap is not None and budget > cap and req.thinking_optional:
        budget = cap
    if budget is not None and cap is not None and budget > cap:
        raise RequestRejected("invalid_request", f"thinking_budget_tokens: {budget} is above this model's "
                                                 f"cap ({cap}, its reasoning_budget_max)")
    if effort is not None and effort != "none" and effort not in s.reasoning_levels:
        known = ", ".join(["none", *s.reasoning_levels])
        raise RequestRejected("invalid_request", f"reasoning_effort: {effort!r} is not a level this model "
                                                 f"knows ({known})")
    asked = req.think is True or enable is True or bool(budget) or (effort not in (None, "none"))
    if fmt is None:
        if asked and not req.thinking_optional:
            raise RequestRejected("invalid_request", f'"{s.model_id}" does not support thinking')
        return None
    if req.think is not None:
        on = req.think
    elif effort is not None:
        on = effort != "none"
    elif budget is not None:
        on = budget != 0
    elif isinstance(enable, bool):
        on = enable
    else:
        on = s.reasoning_budget != 0
    if budget is None:
        if effort is not None and effort != "none":
            budget = s.reasoning_levels[effort]
            if cap is not None:
                budget = min(budget, cap)
        else:
            budget = s.reasoning_budget if s.reasoning_budget != 0 else -1
            if cap is not None and (budget < 0 or budget > cap):
                budget = cap
    if budget == 0:
        on = False
    return Thinking(on, budget if on else 0, effort)


def refuse_thinking(s: wire.WorkerSettings, req: wire.GenerateRequest) -> None:
    """RequestRejected where ``req`` asks for thinking it cannot have: from a raw prompt (no
    template, no split), or from a model without a reasoning format (``wanted``'s checks)."""
    if req.messages is None:
        if req.think:
            raise RequestRejected("invalid_request", "think: thinking is split from chat messages only, "
                                                     "not from a raw prompt")
        return
    wanted(None, s, req)


def template_vars(t: Thinking | None, req: wire.GenerateRequest, source: str) -> dict[str, Any]:
    """What the chat template renders with: the request's ``chat_template_kwargs``, and
    ``enable_thinking`` / ``reasoning_effort`` where the template takes them."""
    out = dict(req.template_kwargs or {})
    if t is None:
        return out
    if "enable_thinking" in source:
        out.setdefault("enable_thinking", t.on)
    if "reasoning_effort" in source and t.effort is not None:
        level = t.effort if t.effort in _HARMONY_LEVELS else ("low" if t.effort in ("none", "minimal") else None)
        if level is not None:
            out.setdefault("reasoning_effort", level)
    return out


def prompt_state(fmt: ReasoningFormat, text: str) -> str:
    """Where the rendered prompt leaves the thinking: reasoning (opened), answer
    (closed, or the answer's header), or start."""
    t = text.rstrip()
    if t.endswith(fmt.open.rstrip()):
        return "reasoning"
    ends = (fmt.empty.rstrip(),) if fmt.name == HARMONY else (fmt.close, fmt.empty.rstrip() or fmt.close)
    if any(e and t.endswith(e) for e in ends):
        return "answer"
    return "start"


def plan(fmt: ReasoningFormat, t: Thinking, text: str) -> ReasoningPlan:
    state = prompt_state(fmt, text)
    if t.on:
        prefix = fmt.open if state == "start" else ""
        return ReasoningPlan(fmt, state, prefix, t.budget)
    if state == "reasoning":
        return ReasoningPlan(fmt, state, "", 0)
    if state == "start":
        return ReasoningPlan(fmt, state, fmt.empty, 0) if fmt.empty else ReasoningPlan(fmt, "answer", "", 0)
    return ReasoningPlan(fmt, state, "", 0)


class SlotReasoning:
    """One running request's split, budget and forced tokens. ``token`` runs on the
    engine thread, ``next_forced`` on the slot's sampling thread (never at once)."""

    def __init__(self, p: ReasoningPlan, prefix: list[int], close: list[int], reopen: list[int],
                 grammar: ll.llama_sampler_p | None, *, tag_pieces: dict[int, bytes] | None = None) -> None:
        self.fmt = p.fmt
        self.tag_pieces = tag_pieces or {}  # the text of the tags' control tokens (no piece of their own)
        self.budget = p.budget
        self.splitter: Splitter = (HarmonySplitter if p.fmt.name == HARMONY else TagSplitter)(p.fmt, p.initial)
        self.close = close
        self.forced: deque[int] = deque(prefix)
        self.n_tokens = 0  # drawn (not forced) inside the thinking
        self._in_flight = 0  # forced tokens handed out, not yet through ``token``
        self._grammar = grammar  # held until the answer starts
        self._reopen = reopen  # harmony: the final header, forced after a thinking message
        if self.splitter.in_reasoning and self.budget == 0:
            self.forced.extend(close)

    def next_forced(self) -> int | None:
        if self.forced:
            self._in_flight += 1
            return self.forced.popleft()
        return None

    def _idle(self) -> bool:
        return not self.forced and self._in_flight == 0

    def token(self, text: str) -> tuple[str, str]:
        """One generated token's text (whole characters; "" for a partial one) ->
        (reasoning, answer) to send."""
        if self._in_flight:
            self._in_flight -= 1
        elif self.splitter.in_reasoning:
            self.n_tokens += 1
        out = self.splitter.push(text)
        if self._idle() and self.splitter.in_reasoning and 0 <= self.budget <= self.n_tokens:
            self.forced.extend(self.close)
        elif self._idle() and self.splitter.between and self._grammar is not None and self._reopen:
            self.forced.extend(self._reopen)  # harmony: a schema's answer goes to the final channel
        return out

    def text(self, text: str) -> tuple[str, str]:
        """Text that is no token's (the decoder's tail at the end)."""
        return self.splitter.push(text)

    def finish(self) -> tuple[str, str]:
        return self.splitter.finish()

    def replace_eog(self) -> int | None:
        """An end-of-generation token inside the thinking: the close sequence instead (its
        first token, the rest queued); None where the token may end the request."""
        if not self.splitter.in_reasoning or not self._idle() or not self.close:
            return None
        self.forced.extend(self.close)
        return self.next_forced()

    def take_grammar(self) -> ll.llama_sampler_p | None:
        """The held grammar, once the answer has started (then the caller owns it)."""
        if self._grammar is None or not self.splitter.answering or not self._idle():
            return None
        g, self._grammar = self._grammar, None
        return g

    def free(self) -> None:
        if self._grammar is not None:
            ll.llama_sampler_free(self._grammar)
            self._grammar = None
