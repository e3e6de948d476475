"""The wire types of code infill and inspection (llama-server's /infill and /slots, vLLM's
/tokenizer_info).
Re-exported by ``corral.wire`` (import them from there). Imports nothing of corral."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["Infill", "InfillChunk", "SlotState", "TokenizerInfo"]


class InfillChunk(msgspec.Struct, frozen=True):
    """One extra context chunk of an infill request (llama-server's ``input_extra`` item)."""

    filename: str
    text: str


class Infill(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A fill-in-the-middle request: the worker builds the prompt from the model's FIM
    tokens (``worker/output/infill.py``); the request's ``prompt`` (if any) follows the middle
    token. ``n_indent``: stop at a line indented less (after the first); the time limit is
    ``GenerateRequest.t_max_predict_ms`` (any request's)."""

    prefix: str = ""
    suffix: str = ""
    extra: list[InfillChunk] = []
    n_indent: Annotated[int, Meta(ge=0, le=1 << 20)] = 0


class SlotState(msgspec.Struct, frozen=True, kw_only=True):
    """One worker slot as ``GET /slots`` shows it."""

    id: int
    n_ctx: int
    is_processing: bool
    request_id: str = ""  # the running request; "" when free
    n_prompt_tokens: int = 0
    n_prompt_tokens_cache: int = 0  # prompt tokens reused from the slot's cache
    n_decoded: int = 0
    n_remain: int = 0
    n_cached: int = 0  # tokens in the slot's KV cache


class TokenizerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a client needs to tokenize for the model itself (GET /tokenizer_info):
    special tokens as text ("" where the vocabulary has none), whether the vocabulary adds
    BOS/EOS to a prompt, and the chat template the worker renders with (None: none,
    corral's plain User:/Assistant: turns)."""

    bos_token: str
    eos_token: str
    eot_token: str
    pad_token: str
    add_bos: bool
    add_eos: bool
    chat_template: str | None
