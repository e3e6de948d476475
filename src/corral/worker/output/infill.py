"""Fill-in-the-middle: the prompt built from the model's FIM tokens, and the infill stop rules.

The prompt is llama-server's (format_prompt_infill), the repo-level form of
https://arxiv.org/pdf/2409.12186 when the vocabulary has the repository and file
separator tokens:

    [FIM_REP]myproject\\n [FIM_SEP]filename0\\n chunk0 ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

(without them, extra chunks are joined by a ``--- snippet ---`` separator). Prefix and
suffix take at most a batch (prefix 3/4 of it, from its end; suffix the rest, from its
start); the extra chunks take up to ``n_ctx - n_batch + 2`` tokens (llama-server's budget
with its default n_predict of -1), keeping their end, and never the room the request
generates in. Text is tokenized without special tokens.

``InfillOutput`` adds llama-server's ``n_indent`` (stop at a line, after the first, that
is indented less; the line is cut) to a slot's output; its ``t_max_predict_ms`` is any
request's (a step feature: worker/time_limit/).
"""

from __future__ import annotations

import llama_cpp as ll

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.reasoning.plan import SlotReasoning
from corral.worker.output.slot_output import SlotOutput
from corral.worker.tokens import Tokenizer
from corral.worker.output.toolcalls import ToolCallParser

__all__ = ["InfillOutput", "fim_missing", "infill_tokens", "slot_output"]

_SNIPPET = "\n\n--- snippet ---\n\n"


def fim_missing(vocab: ll.llama_vocab_p) -> list[str]:
    """The FIM tokens this vocabulary lacks (prefix, suffix, middle)."""
    parts = (("prefix", ll.llama_vocab_fim_pre), ("suffix", ll.llama_vocab_fim_suf), ("middle", ll.llama_vocab_fim_mid))
    return [name for name, f in parts if f(vocab) < 0]


def infill_tokens(tok: Tokenizer, model_id: str, req: wire.GenerateRequest, *, n_batch: int, n_ctx: int) -> list[int]:
    inf = req.infill
    assert inf is not None
    vocab = tok.vocab
    missing = fim_missing(vocab)
    if missing:
        raise RequestRejected("invalid_request", f"model {model_id} does not support infill: its vocabulary has no "
                                                 f"FIM {', '.join(missing)} token")

    def toks(text: str) -> list[int]:
        return tok.tokenize(text, add_special=False, parse_special=False)

    rep, sep = ll.llama_vocab_fim_rep(vocab), ll.llama_vocab_fim_sep(vocab)
    extra: list[int] = []
    if rep >= 0:
        extra += [rep, *toks("myproject\n")]
    for chunk in inf.extra:
        extra += [sep, *toks((chunk.filename or "tmp") + "\n")] if sep >= 0 else toks(_SNIPPET)
        extra += toks(chunk.text)
    if sep >= 0:
        extra += [sep, *toks("filename\n")]
    prompt = tok.tokenize(req.prompt or "", add_special=False, parse_special=True)
    prefix, suffix = toks(inf.prefix), toks(inf.suffix)
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    head = [ll.llama_vocab_fim_pre(vocab), *prefix[len(prefix) - n_prefix:], *prompt]
    if ll.llama_vocab_get_add_bos(vocab):
        head.insert(0, ll.llama_vocab_bos(vocab))
    tail = [ll.llama_vocab_fim_suf(vocab), *suffix[:n_suffix]]
    # llama-server budgets with its server-wide n_predict (-1 unless set): n_ctx - n_batch + 2;
    # beyond that, the extra context never takes the room the request generates in
    n_extra = min(max(0, n_ctx - n_batch + 2), len(extra))
    room = n_ctx - 1 - (req.params.max_tokens or 0) - len(head) - len(tail) - 1
    n_extra = max(0, min(n_extra, room))
    return [*extra[len(extra) - n_extra:], *head, *tail, ll.llama_vocab_fim_mid(vocab)]


class InfillOutput(SlotOutput):
    def __init__(self, request_id: str, stops: list[str], tool_parser: ToolCallParser | None,
                 n_indent: int) -> None:
        super().__init__(request_id, stops, tool_parser)
        self.n_indent = n_indent
        self.text = ""  # sent so far
        self.limited = False

    @property
    def stopped(self) -> bool:
        return self.limited or self.stop.stopped

    def token(self, piece: bytes, logprob: wire.TokenLogprob | None, token: int = -1) -> wire.Delta | None:
        d = super().token(piece, logprob, token)
        if d is None or self.limited:
            return d
        text = d.text
        start = len(self.text)
        self.text += text
        if self.n_indent > 0:
            cut = self._indent_cut()
            if cut is not None:
                self.limited = True
                return wire.Delta(d.id, text[:max(0, cut - start)], d.n_tokens, d.logprobs, d.tool_calls)
        return d

    def _indent_cut(self) -> int | None:
        """Where the text is cut when a new line's indentation is below n_indent, else None."""
        pos = self.text.find("\n")
        while pos >= 0:
            line = pos + 1
            i = line
            while i < len(self.text) and self.text[i] in " \t":
                i += 1
            if i < len(self.text) and i - line < self.n_indent:
                return i
            pos = self.text.find("\n", line)
        return None

    def finish(self) -> wire.Delta | None:
        return None if self.limited else super().finish()


def slot_output(req: wire.GenerateRequest, stops: list[str], parser: ToolCallParser | None, *,
                template_stops: list[str] | None = None, reasoning: SlotReasoning | None = None) -> SlotOutput:
    """The slot's output: an infill request's with n_indent (a plain text prompt: no template
    stops, no thinking), else the plain one."""
    inf = req.infill
    if inf is None or inf.n_indent == 0:
        return SlotOutput(req.id, stops, parser, template_stops=template_stops, reasoning=reasoning)
    return InfillOutput(req.id, stops, parser, inf.n_indent)
