"""A request on the wire, router -> worker: a generation (``GenerateRequest``: a prompt,
its tokens or chat messages, with ``SamplingParams``), an embedding or rerank
(``EmbedRequest``), a tokenization or template rendering (``TokenizeRequest``), and the
``Abort`` of any of them. Their answers: ``corral.wire.answers``.

The bounds of every numeric field are declared here once (msgspec ``Meta``):
``invalid_field`` is the router's check before a request takes a slot, and the worker's
decode applies the same bounds. Imports only ``corral.model.settings`` and the wire's own topics.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from corral.model.settings import INT32_MAX
from corral.wire.editors import Infill
from corral.wire.lora import LoraScale

__all__ = ["ToolCall", "MEDIA_MARKER", "ChatMessage", "INT64_MIN", "INT64_MAX", "SamplingParams", "invalid_field",
           "GenerateRequest", "TokenizeRequest", "EmbedRequest", "Abort"]


class ToolCall(msgspec.Struct, frozen=True):
    """A function call: ``arguments`` is JSON text (OpenAI's shape)."""

    id: str
    name: str
    arguments: str


MEDIA_MARKER = "<__media__>"  # where an image sits in a turn's or a prompt's text (llama-server's marker)


class ChatMessage(msgspec.Struct, frozen=True, omit_defaults=True):
    role: str
    content: str
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # role "tool": the call this result answers
    name: str | None = None  # role "tool": the function's name
    reasoning: str | None = None  # an assistant turn's thinking (templates that render it get it)
    # vision: the encoded image files (PNG, JPEG, ...; checked by the router) of this turn, in the
    # order of the MEDIA_MARKERs in ``content`` (each image sits where its marker is)
    images: list[bytes] | None = None


# The bounds of every numeric request field, in one place: the router validates a
# request against them before it takes a slot (``invalid_field``), and the worker
# refuses what lies outside them (the same check, and msgspec on decode). Each is
# within what msgpack carries and what llama.cpp takes.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    # None: until EOS or the slot's context is full; 0: nothing is generated
    max_tokens: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] = 0.8  # 0: greedy
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.95
    top_k: Annotated[int, Meta(ge=0, le=INT32_MAX)] = 40  # 0: off
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.05
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=100.0)] = 1.0
    repeat_last_n: Annotated[int, Meta(ge=-1, le=INT32_MAX)] = 64  # -1: the whole context
    presence_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Meta(ge=-2.0, le=2.0)] = 0.0
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: list[str] = []
    ignore_eos: bool = False
    # token id -> added to its logit; <= -100 bans it
    logit_bias: dict[Annotated[int, Meta(ge=0, le=INT32_MAX)], Annotated[float, Meta(ge=-100.0, le=100.0)]] = {}


def invalid_field(obj: msgspec.Struct) -> tuple[str, str] | None:
    """The first field of a wire message (or of ``SamplingParams``) outside its bounds,
    as (dotted path, message); None if all are within them. A struct built in Python
    is not checked on construction: the router checks before a request takes a slot."""
    try:
        msgspec.convert(msgspec.to_builtins(obj), type(obj))
    except msgspec.ValidationError as exc:
        text = str(exc)
        head, sep, path = text.rpartition(" - at `$.")
        if not sep:
            return "", text
        return path.rstrip("`").split("[")[0], head
    return None


class GenerateRequest(msgspec.Struct, frozen=True, tag="generate", kw_only=True, omit_defaults=True):
    """Exactly one of prompt / prompt_tokens / messages is set. The worker renders
    messages with the model's template (or the configured pre/user/ai prompts).

    Structured output: at most one of ``grammar`` (GBNF text) and ``json_schema`` (JSON
    text; the worker converts it to GBNF). ``tools`` (OpenAI tool objects) reach the
    chat template; ``parse_tool_calls`` makes the worker parse calls out of the output.
    ``logprobs``: None, or how many top alternatives per token (0-20).
    ``echo``: the first Delta is the prompt itself (text and, with logprobs, its tokens'
    logprobs; the first token's is None)."""

    id: str
    prompt: str | None = None
    prompt_tokens: list[Annotated[int, Meta(ge=0, le=INT32_MAX)]] | None = None
    messages: list[ChatMessage] | None = None
    params: SamplingParams = SamplingParams()
    add_special: bool = True  # add BOS for raw prompts when the model wants it
    grammar: str | None = None
    json_schema: str | None = None
    tools: list[dict[str, Any]] | None = None
    parse_tool_calls: bool = False
    parallel_tool_calls: bool = True  # False: at most one call is parsed
    logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    echo: bool = False
    # reasoning (worker/reasoning/): think None = the model's default; thinking_budget in
    # tokens (None: from reasoning_effort's level or the model's default); template_kwargs
    # reach the chat template as variables (llama-server's chat_template_kwargs)
    think: bool | None = None
    thinking_budget: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    reasoning_effort: str | None = None
    # thinking asked as a preference (Anthropic's ``thinking``): a model without a reasoning
    # format ignores it instead of refusing, and a budget above the model's cap runs at the cap
    thinking_optional: bool = False
    template_kwargs: dict[str, Any] | None = None
    infill: Infill | None = None  # fill-in-the-middle: the prompt is built from the model's FIM tokens
    speculative: bool | None = None  # draft and verify (the model's ``speculative``); None: as the model says
    images: list[bytes] | None = None  # vision, with ``prompt``: the image files, in the order of its MEDIA_MARKERs
    # the windows of one recording (api/openai/audio_routes.py) share this id: their media work
    # does not yield to one another's generation as it yields to other streams (media/steps.py)
    media_group: str | None = None
    lora: list[LoraScale] | None = None  # adapter scales (wire/lora.py); None: the model's defaults
    # whose prompt cache this request may reuse and fill (the router's corral.control.keys.cache_tenant:
    # a digest of the key or its cache_group and the body's cache_salt; "": the one tenant of a
    # server without keys). The worker reuses a slot's prefix or a saved entry only of the same tenant.
    cache_tenant: str = ""
    # the most prompt + completion tokens it may use (the key's reservation, control/keys/limits.py)
    token_budget: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    # llama-server's generation time limit: end with "length" at a new line once generating
    # (from the first token) took longer than this many ms; 0: none (worker/time_limit/)
    t_max_predict_ms: Annotated[int, Meta(ge=0, le=1 << 40)] = 0


class TokenizeRequest(msgspec.Struct, frozen=True, tag="tokenize", kw_only=True):
    """Exactly one of text / tokens / messages: tokenize text, detokenize tokens, or render
    messages (and tools) with the model's chat template (``Tokenized.text``, /apply-template)."""

    id: str
    text: str | None = None
    tokens: list[Annotated[int, Meta(ge=0, le=INT32_MAX)]] | None = None
    add_special: bool = False
    parse_special: bool = True
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None


class EmbedRequest(msgspec.Struct, frozen=True, tag="embed", kw_only=True):
    """Pooled embeddings of ``inputs``; with ``query``: rerank, each input a document scored
    against it (``Embeddings.data[i] == [score]``). ``truncate``: an input longer than the
    model embeds is cut to fit, not refused."""

    id: str
    inputs: list[str]
    normalize: bool = True
    query: str | None = None
    truncate: bool = False


class Abort(msgspec.Struct, frozen=True, tag="abort"):
    id: str
