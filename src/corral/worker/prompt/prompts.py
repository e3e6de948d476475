"""A request's prompt -> tokens, size-checked, off the decode loop.

The worker's reader thread calls ``PromptPreparer.tokens`` for each GenerateRequest as
it arrives (in wire order, so an Abort still follows its request), so tokenizing a
long prompt never delays the decode step every other stream of the model waits for.
``llama_tokenize`` only reads the vocabulary, which nothing changes after load.

Input that cannot fit is refused before it is tokenized: every token stands for at
most ``max_piece_bytes`` bytes of text (the longest token text of the vocabulary), so
a prompt of more than ``(n_ctx_slot + 1) * max_piece_bytes`` bytes has more tokens
than the slot holds. Below that bound it is tokenized and the exact count decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.media.prompt import MediaTokenizer, request_media
from corral.worker.output.infill import infill_tokens
from corral.worker.model import LoadedModel, ModelLoadError
from corral.worker.reasoning.plan import ReasoningPlan
from corral.worker.prompt.templates import ChatTemplate, TemplateError, TemplateRefused, choose_template, render_chat
from corral.worker.tokens import Tokenizer

__all__ = ["PreparedRequest", "PromptPreparer", "model_template"]


def model_template(settings: wire.WorkerSettings, m: LoadedModel,
                   tok: Tokenizer) -> tuple[ChatTemplate | None, str | None]:
    """The model's chat template (its settings', else its GGUF's) and, where it cannot be
    used, why (requests with messages are then refused with that); none for embeddings.
    A template refused by its bounds (too large; stopped while probed) fails the load."""
    if m.embedding:
        return None, None
    try:
        return choose_template(settings, m.meta("tokenizer.chat_template"),
                               tok.special_text(ll.llama_vocab_bos(m.vocab)),
                               tok.special_text(ll.llama_vocab_eos(m.vocab))), None
    except TemplateRefused as exc:
        raise ModelLoadError(str(exc)) from None
    except TemplateError as exc:
        return None, str(exc)


@dataclass(frozen=True, eq=False)
class PreparedRequest:
    """A GenerateRequest with its prompt tokens, ready for a slot."""

    req: wire.GenerateRequest
    tokens: list[int]
    gbnf: str | None = None  # the request's grammar (GBNF), converted from its JSON schema if needed
    reasoning: ReasoningPlan | None = None  # how its thinking runs (chat requests of a reasoning model)


class PromptPreparer:
    def __init__(self, tok: Tokenizer, template: ChatTemplate | None, template_error: str | None,
                 n_ctx_slot: int, *, model_id: str = "", n_batch: int = 512) -> None:
        self.model_id = model_id
        self.n_batch = n_batch  # infill: prefix and suffix fit one batch (worker/output/infill.py)
        self.tok = tok
        self.template = template
        self.template_error = template_error
        self.n_ctx_slot = n_ctx_slot
        self._max_piece: int | None = None
        self.media: MediaTokenizer | None = None  # the engine's media (worker/media/steps.py)

    def max_piece_bytes(self) -> int:
        """The longest token text in bytes (computed once, when first needed)."""
        if self._max_piece is None:
            vocab = self.tok.vocab
            longest = max((len(ll.llama_vocab_get_text(vocab, t) or b"")
                           for t in range(self.tok.n_vocab)), default=1)
            self._max_piece = max(1, longest)
        return self._max_piece

    def _check_bytes(self, text: str, field: str) -> None:
        limit = self.n_ctx_slot
        n_bytes = len(text)  # characters <= bytes: a cheap first look
        if n_bytes <= limit:
            return
        n_bytes = len(text.encode("utf-8", "surrogatepass"))
        bound = (limit + 1) * self.max_piece_bytes()
        if n_bytes > bound:
            raise RequestRejected(
                "context_length_exceeded",
                f"the {field} has {n_bytes} bytes, more than the {limit} tokens this model's "
                f"context per request holds can cover (at most {bound} bytes); it was not tokenized")

    def render(self, messages: list[wire.ChatMessage], tools: list[dict[str, Any]] | None,
               extra: dict[str, Any] | None = None) -> str:
        """The chat as the model's template renders it (the prompt a chat request runs on);
        ``extra``: template variables."""
        if self.template is None:
            raise RequestRejected("invalid_request", f"chat template unusable: {self.template_error}")
        try:
            return render_chat(self.template, messages, tools, extra)
        except TemplateError as exc:
            raise RequestRejected("invalid_request", str(exc)) from exc

    def tokens(self, req: wire.GenerateRequest) -> list[int]:
        return self.tokens_text(req)[0]

    def tokens_text(self, req: wire.GenerateRequest, extra: dict[str, Any] | None = None
                    ) -> tuple[list[int], str | None]:
        """The prompt's tokens, and the rendered chat (None for a raw prompt); ``extra``:
        template variables."""
        text: str | None = None
        if req.infill is not None:
            # no byte bound: llama-server takes a prefix and suffix of any length and keeps what fits
            if req.messages is not None or req.prompt_tokens is not None:
                raise RequestRejected("invalid_request", "infill takes a text prompt, not messages or tokens")
            tokens = infill_tokens(self.tok, self.model_id, req, n_batch=self.n_batch, n_ctx=self.n_ctx_slot)
            return self._check_length(tokens), None
        if sum(x is not None for x in (req.prompt, req.prompt_tokens, req.messages)) != 1:
            raise RequestRejected("invalid_request", "exactly one of prompt and messages must be given")
        if req.messages is not None:
            self._check_bytes("".join(m.content for m in req.messages), "messages")
            text = self.render(req.messages, req.tools, extra)
            self._check_bytes(text, "rendered chat")
            tokens = self._tokenize(text, request_media(req), add_special=not self.tok.starts_with_bos(text))
        elif req.prompt_tokens is not None:
            tokens = list(req.prompt_tokens)
            bad = next((t for t in tokens if not 0 <= t < self.tok.n_vocab), None)
            if bad is not None:
                raise RequestRejected("invalid_request", f"prompt: token id {bad} is not in this model's "
                                                         f"vocabulary (0..{self.tok.n_vocab - 1})")
        else:
            self._check_bytes(req.prompt or "", "prompt")
            media = request_media(req)
            if media and req.echo:
                raise RequestRejected("invalid_request", "echo is for text prompts, not prompts with images or other media")
            tokens = self._tokenize(req.prompt or "", media, add_special=req.add_special)
        return self._check_length(tokens), text

    def _tokenize(self, text: str, media: list[bytes], *, add_special: bool) -> list[int]:
        """Text alone, or text and its media (worker/media/prompt.py: a ``MediaPrompt``)."""
        if not media:
            return self.tok.tokenize(text, add_special=add_special)
        if self.media is None:
            raise RequestRejected("invalid_request", f"model {self.model_id} does not take images or other media")
        return self.media.tokenize(text, media, add_special=add_special)

    def _check_length(self, tokens: list[int]) -> list[int]:
        if not tokens:
            raise RequestRejected("invalid_request", "the prompt is empty")
        limit = self.n_ctx_slot
        if len(tokens) >= limit:
            raise RequestRejected(
                "context_length_exceeded",
                f"the prompt has {len(tokens)} tokens, but this model's context per request is "
                f"{limit} tokens (at least 1 must be left to generate)",
            )
        return tokens
