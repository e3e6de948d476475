"""What a generating slot sends: token pieces -> whole characters -> [thinking | answer
split, worker/reasoning/plan.py] -> the answer's stop-string holdback -> tool-call parsing ->
``wire.Delta`` (the thinking in ``reasoning``; with the tokens' logprobs, for requests that
asked). One per running request; pure Python, no llama.cpp."""

from __future__ import annotations

from corral import wire
from corral.worker.output.detokenize import StopMatcher, Utf8Stream
from corral.worker.reasoning.plan import SlotReasoning
from corral.worker.output.toolcalls import ToolCallParser

__all__ = ["SlotOutput"]


class SlotOutput:
    def __init__(self, request_id: str, stops: list[str], tool_parser: ToolCallParser | None,
                 *, template_stops: list[str] | None = None, reasoning: SlotReasoning | None = None) -> None:
        self.id = request_id
        self.reasoning = reasoning
        self.utf8 = Utf8Stream()
        self.stop = StopMatcher(stops, after_text=template_stops)  # those end only a non-empty answer
        self.parser = tool_parser
        self.n_unsent = 0  # generated tokens not yet covered by a Delta
        self.logprobs: list[wire.TokenLogprob] = []

    @property
    def stopped(self) -> bool:
        return self.stop.stopped

    def token(self, piece: bytes, logprob: wire.TokenLogprob | None, token: int = -1) -> wire.Delta | None:
        """One generated token (not an end-of-generation one), ``token`` with its text
        ``piece``; the Delta to send, if any. A tag's control token (no piece) has its text
        for a slot that splits thinking from answer."""
        self.n_unsent += 1
        if logprob is not None:
            self.logprobs.append(logprob)
        if self.reasoning is None:
            return self._emit(self.stop.push(self.utf8.push(piece)), [])
        thought, answer = self.reasoning.token(self.utf8.push(piece or self.reasoning.tag_pieces.get(token, b"")))
        return self._emit(self.stop.push(answer), [], thought)

    def finish(self) -> wire.Delta | None:
        """At the end (not on abort): release what was held back."""
        rest, thought = self.utf8.flush(), ""
        if self.reasoning is not None:
            thought, rest = self.reasoning.text(rest)
            more_thought, more_rest = self.reasoning.finish()
            thought, rest = thought + more_thought, rest + more_rest
        tail = self.stop.push(rest) if not self.stop.stopped else ""
        tail += self.stop.flush()
        calls: list[wire.ToolCall] = []
        if self.parser is not None:
            tail, calls = self.parser.push(tail)
            more, late = self.parser.finish()
            tail += more
            calls += late
        if not tail and not calls and not thought:
            return None
        return self._send(tail, calls, thought)

    def _emit(self, text: str, calls: list[wire.ToolCall], thought: str = "") -> wire.Delta | None:
        if self.parser is not None and text:
            text, calls = self.parser.push(text)
        if not text and not calls and not thought:
            return None
        return self._send(text, calls, thought)

    def _send(self, text: str, calls: list[wire.ToolCall], thought: str = "") -> wire.Delta:
        if thought:
            d = wire.Delta(self.id, text, self.n_unsent, self.logprobs, calls, thought)
            self.logprobs = []
        elif self.logprobs:
            d = wire.Delta(self.id, text, self.n_unsent, self.logprobs, calls)
            self.logprobs = []
        else:
            d = wire.Delta(self.id, text, self.n_unsent, tool_calls=calls) if calls else \
                wire.Delta(self.id, text, self.n_unsent)
        self.n_unsent = 0
        return d
