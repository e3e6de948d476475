"""A request on the wire, router -> worker: a generation (``GenerateRequest``: a prompt,
its tokens or chat messages, with ``SamplingParams``), an embedding or rerank
(``EmbedRequest``), a tokenization or template rendering (``TokenizeRequest``), and the
``Abort`` of any of them. Their answers: ``corral.wire.answers``.

The bounds of every numeric field are declared here once (msgspec ``Meta``):
``invalid_field`` is the router's check before a request takes a slot, and the worker's
decode applies the same bounds. Imports only ``corral.model.settings`` and the wire's own topics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from corral.model.settings import (INT32_MAX, SAMPLING_BUILTIN, SAMPLING_KEYS, Breakers, DryBase, DryLength,
                                   DryMultiplier, LastN, Penalty, Probability, RepeatPenalty, Temperature, TopK)
from corral.wire.editors import Infill
from corral.wire.lora import LoraScale

__all__ = ["ToolCall", "MEDIA_MARKER", "ChatMessage", "INT64_MIN", "INT64_MAX", "SamplingParams", "SamplingValues", "spelled", "sampling_from", "PromptFormat", "invalid_field",
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
    """A request's sampling. A knob left None is "the model's default": the router fills it
    from the model's generation defaults (``corral.control.generation_defaults``), and the
    worker takes the rest from ``SAMPLING_BUILTIN`` (``values``). The bounds are the
    model settings' (``corral.model.settings``): declared once."""

    # None: the model's default_max_tokens, else until EOS or the slot's context is full;
    # 0: nothing is generated
    max_tokens: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    temperature: Temperature | None = None  # 0: greedy
    top_p: Probability | None = None
    top_k: TopK | None = None  # 0: off
    min_p: Probability | None = None
    typical_p: Probability | None = None  # 1: off
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: LastN | None = None  # -1: the whole context
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    dry_multiplier: DryMultiplier | None = None  # 0: DRY off
    dry_base: DryBase | None = None
    dry_allowed_length: DryLength | None = None
    dry_penalty_last_n: LastN | None = None
    dry_sequence_breakers: Breakers | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    # token id -> added to its logit; <= -100 bans it
    logit_bias: dict[Annotated[int, Meta(ge=0, le=INT32_MAX)], Annotated[float, Meta(ge=-100.0, le=100.0)]] = {}

    def over(self, defaults: Mapping[str, Any]) -> "SamplingParams":
        """These params with each knob left None taken from ``defaults`` (a model's)."""
        fill = {k: v for k, v in defaults.items() if v is not None and getattr(self, k, 0) is None}
        return msgspec.structs.replace(self, **fill) if fill else self

    def values(self) -> "SamplingValues":
        """Every knob set: the request's (or the model's, filled by the router), else
        ``SAMPLING_BUILTIN``."""
        got = {k: getattr(self, k) for k in SAMPLING_KEYS}
        return SamplingValues(**{k: SAMPLING_BUILTIN[k] if v is None else v for k, v in got.items()},
                              max_tokens=self.max_tokens, seed=self.seed, ignore_eos=self.ignore_eos,
                              logit_bias=self.logit_bias)


def spelled(spelling: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each field of ``SamplingParams`` -> its name in a dialect's request body: the one name
    list of every dialect. ``spelling`` maps the fields a dialect names otherwise (Ollama's
    ``num_predict`` for ``max_tokens``); every other field keeps the wire's name."""
    return {f: (spelling or {}).get(f, f) for f in SamplingParams.__struct_fields__}


def sampling_from(body: Mapping[str, Any], spelling: Mapping[str, str] | None = None,
                  **converted: Any) -> SamplingParams:
    """A request body's sampling (``body``: its fields, e.g. ``vars(model)``): every field of
    ``SamplingParams`` the body sets (not None) under its dialect's name (``spelled``), then
    ``converted``, which win: the fields a dialect does not carry as the wire does (a ``stop``
    string, -1 for "no limit", logit bias keyed by text). Bounds: ``invalid_field``."""
    given = {f: v for f, name in spelled(spelling).items() if (v := body.get(name)) is not None}
    return SamplingParams(**{**given, **converted})


class SamplingValues(msgspec.Struct, frozen=True, kw_only=True):
    """``SamplingParams`` with every knob set (``SamplingParams.values``): what the
    worker's sampler reads."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    typical_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: list[str]
    seed: int | None
    stop: list[str]
    ignore_eos: bool
    logit_bias: dict[int, float]


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


class PromptFormat(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The plain (Nitro-style) prompt of a variant (model settings of the same names): a
    worker whose model has no chat template renders this request's chat with these."""

    pre_prompt: str | None = None
    user_prompt: str | None = None
    ai_prompt: str | None = None
    system_prompt: str | None = None


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
    # a variant's plain prompt (None: the worker's own; only models without a chat template)
    prompt_format: PromptFormat | None = None


class TokenizeRequest(msgspec.Struct, frozen=True, tag="tokenize", kw_only=True):
    """Exactly one of text / tokens / messages: tokenize text, detokenize tokens, or render
    messages (and tools) with the model's chat template (``Tokenized.text``, /apply-template);
    ``prompt_format``: a variant's plain prompt, as in ``GenerateRequest``."""

    id: str
    text: str | None = None
    tokens: list[Annotated[int, Meta(ge=0, le=INT32_MAX)]] | None = None
    add_special: bool = False
    parse_special: bool = True
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt_format: PromptFormat | None = None


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
