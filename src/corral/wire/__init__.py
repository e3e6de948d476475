"""Typed messages between the router and a worker process, and their framing.

This module is the whole contract across the process boundary (with ``corral.wire.gpu``,
``corral.wire.model``, ``corral.wire.editors`` and ``corral.wire.slots``, whose types it re-exports; a new topic's
types go in a ``wire_<topic>.py`` of their own). It imports nothing else of corral but
``corral.settings`` and ``corral.frames`` (leaf modules), so both sides (``corral.control`` in the router and ``corral.worker``)
depend on it and never on each other.

Transport: one ``socket.socketpair()`` per worker, created by the router; the child
end is inherited (``pass_fds``) and named with ``--fd N``. No filesystem path, no TCP
port: no other local user can reach it. EOF on the socket means the router is gone,
and the worker exits.

Framing (``corral.frames``, shared with the download child's channel): each message
is ``4-byte big-endian length`` + msgpack body. The body is a
tagged msgspec struct (``{"type": "<tag>", ...}``); ``decode`` returns the concrete
struct, so handlers ``match`` on the class.

Conversation:

    router                                   worker
      | ---- (spawn with WorkerSettings) ---> |
      | <--------------- Loading ------------ |
      | <------- Ready | LoadFailed --------- |   (LoadFailed: worker exits non-zero)
      | -- GenerateRequest / EmbedRequest --> |
      | <--- Delta* then Finished ----------- |   (or RequestFailed)
      | <--- Embeddings --------------------- |   (or RequestFailed; EmbedRequest.query: rerank scores)
      | -- TokenizeRequest -----------------> |
      | <--- Tokenized ---------------------- |   (or RequestFailed)
      | ---------------- Abort -------------> |   (answered by Finished(reason="abort"),
      |                                       |    or nothing if the id is unknown)
      | ------------- StatsRequest ---------> |
      | <---------------- Stats ------------- |
      | --------------- Shutdown -----------> |   (worker drains nothing, exits 0)
      (the prompt cache's frames: corral.wire.cache)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta

from corral import frames
from corral.frames import HEADER, FrameTooLarge, frame
from corral.settings import INT32_MAX, ModelSettings
from corral.wire.cache import PersistCache, PromptCacheDisk, PromptCacheStats
from corral.wire.editors import Infill, InfillChunk, SlotState, TokenizerInfo
from corral.wire.gpu import BufferSize, DeviceInfo, DevicePlacement, DevicePlan, FitPlan, host_and_gpu_bytes
from corral.wire.lora import LoraAdapterInfo, LoraScale
from corral.wire.model import DraftInfo, ModelInfo
from corral.wire.preempt import Paused, Preempt, Resume
from corral.wire.slots import SlotFileAction, SlotFileDone, SlotFileError, SlotFileVerb, filename_problem

__all__ = [
    "PROTOCOL_VERSION", "WorkerSettings", "ChatMessage", "ToolCall", "SamplingParams",
    "invalid_field", "GenerateRequest", "EmbedRequest", "Abort", "StatsRequest", "Shutdown",
    "Loading", "ModelInfo", "DraftInfo", "TokenizerInfo", "DeviceInfo", "DevicePlan", "DevicePlacement", "BufferSize", "FitPlan", "host_and_gpu_bytes", "Ready", "LoadFailed", "Delta",
    "TokenLogprob", "TopLogprob", "Usage", "Timings", "Finished", "RequestFailed", "Embeddings",
    "TokenizeRequest", "Tokenized", "Stats", "ToWorker", "FromWorker", "FinishReason",
    "FailureCode", "encode", "decode_to_worker", "decode_from_worker", "FrameDecoder",
    "FrameTooLarge", "HEADER", "MAX_FRAME", "Infill", "InfillChunk", "SlotState", "LoraScale", "LoraAdapterInfo",
    "SlotFileAction", "SlotFileDone", "SlotFileError", "SlotFileVerb", "filename_problem",
    "PersistCache", "PromptCacheDisk", "PromptCacheStats", "Preempt", "Resume", "Paused",
]

PROTOCOL_VERSION = 1

MAX_FRAME = 256 * 1024 * 1024  # embeddings of large batches can be big; anything above is a bug


# --------------------------------------------------------------------------- settings


class WorkerSettings(ModelSettings, frozen=True, kw_only=True):
    """Everything a worker needs to load one model instance. Passed as JSON on argv.
    The model's settings (``corral.settings.ModelSettings``: defaults and bounds live
    there) plus which model file and which instance this spawn is."""

    model_id: str
    model_path: str
    instance: int = 0
    # set by the router when it placed the instance on a GPU (n_gpu_layers "auto" plans within):
    # its share of each GPU's budget, in the order of ``devices`` (an int: the first GPU's;
    # None: the devices' free memory)
    gpu_budget_bytes: list[int] | int | None = None
    gpu_margin_bytes: int | None = None  # kept free on the GPU (None: corral.fit.plan.DEFAULT_MARGIN_BYTES)
    prompt_cache_disk: PromptCacheDisk | None = None  # None: no prompt cache on disk (wire/cache.py)


# --------------------------------------------------------------------------- router -> worker


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
    # reasoning (worker/reasoning.py): think None = the model's default; thinking_budget in
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
    lora: list[LoraScale] | None = None  # adapter scales (wire/lora.py); None: the model's defaults
    # whose prompt cache this request may reuse and fill (the router's corral.control.cache_tenant:
    # a digest of the key or its cache_group and the body's cache_salt; "": the one tenant of a
    # server without keys). The worker reuses a slot's prefix or a saved entry only of the same tenant.
    cache_tenant: str = ""
    # the most prompt + completion tokens it may use (the key's reservation, control/limits.py)
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


class StatsRequest(msgspec.Struct, frozen=True, tag="stats_request"):
    pass


class Shutdown(msgspec.Struct, frozen=True, tag="shutdown"):
    pass


ToWorker = Union[GenerateRequest, EmbedRequest, TokenizeRequest, Abort, StatsRequest, Shutdown, SlotFileAction,
                 PersistCache, Preempt, Resume]


# --------------------------------------------------------------------------- worker -> router

FinishReason = Literal["stop", "length", "abort"]
FailureCode = Literal[
    "context_length_exceeded",  # prompt does not fit the slot's context
    "invalid_request",  # e.g. embeddings asked of a generation-only model
    "internal",  # the engine failed on this request; the worker goes on
    "over_token_budget",  # the prompt alone is more than the request's token_budget
]


class Loading(msgspec.Struct, frozen=True, tag="loading"):
    pid: int
    protocol: int = PROTOCOL_VERSION


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    pid: int
    info: ModelInfo


class LoadFailed(msgspec.Struct, frozen=True, tag="load_failed"):
    reason: str


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    token: bytes  # the token's piece
    logprob: float
    id: int = -1


class TokenLogprob(msgspec.Struct, frozen=True, array_like=True):
    """One token's log-probability (log-softmax of the model's logits) and its top
    alternatives, most likely first. ``logprob`` is None for a prompt's first token."""

    token: bytes
    logprob: float | None
    top: list[TopLogprob] = []
    id: int = -1


class Delta(msgspec.Struct, frozen=True, tag="delta", omit_defaults=True):
    """New output for a request. ``text`` is always whole UTF-8 characters and never
    contains (a prefix of) a stop string that may still complete. ``logprobs``: one per
    token this delta covers (requests that asked). ``tool_calls``: calls parsed out of
    the output (their text is not in ``text``)."""

    id: str
    text: str
    n_tokens: int  # tokens this delta covers
    logprobs: list[TokenLogprob] = []
    tool_calls: list[ToolCall] = []
    reasoning: str = ""  # thinking text (never in ``text``; its tags in neither)


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the slot's KV cache
    reasoning_tokens: int = 0  # of completion_tokens, drawn inside the thinking


class Timings(msgspec.Struct, frozen=True):
    prompt_ms: float
    predicted_ms: float
    prompt_per_second: float
    predicted_per_second: float
    queued_ms: float = 0.0  # waiting inside the worker for a slot
    grammar_ms: float = 0.0  # spent checking and resampling with a grammar (constrained requests)


class Finished(msgspec.Struct, frozen=True, tag="finished"):
    id: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    slot: int = -1
    stop_string: str | None = None  # the stop string that ended it (finish_reason "stop")
    reasoning_budget: int | None = None  # the thinking budget it ran with (-1: none; None: no thinking)


class RequestFailed(msgspec.Struct, frozen=True, tag="request_failed"):
    id: str
    code: FailureCode
    message: str


class Embeddings(msgspec.Struct, frozen=True, tag="embeddings"):
    id: str
    data: list[list[float]]
    prompt_tokens: int


class Tokenized(msgspec.Struct, frozen=True, tag="tokenized"):
    """Answer to TokenizeRequest: the tokens, their pieces, and the text (detokenized)."""

    id: str
    tokens: list[int]
    pieces: list[bytes]
    text: str


class Stats(msgspec.Struct, frozen=True, kw_only=True, tag="stats"):
    slots_busy: int
    slots_total: int
    waiting: int  # accepted requests not yet in a slot
    rss_bytes: int
    model_bytes: int
    kv_bytes: int
    tokens_generated: int  # since start
    tokens_prompt: int
    slots: list[SlotState] = []  # each slot's state (GET /slots)
    spec_drafted: int = 0  # draft tokens verified (worker/speculation/speculator.py)
    spec_accepted: int = 0  # of them accepted
    gen_steps: int = 0  # slot-steps that emitted tokens; tokens_generated / gen_steps: tokens per step
    prompt_cache: PromptCacheStats | None = None  # None: no prompt cache (wire/cache.py)


FromWorker = Union[
    Loading, Ready, LoadFailed, Delta, Finished, RequestFailed, Embeddings, Tokenized, Stats, SlotFileDone, Paused
]


# --------------------------------------------------------------------------- framing

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


def encode(msg: ToWorker | FromWorker) -> bytes:
    """One framed message, ready for ``sock.sendall`` / ``writer.write``."""
    return frame(_encoder.encode(msg), MAX_FRAME)


def decode_to_worker(body: bytes | memoryview) -> ToWorker:
    return _to_worker.decode(body)


def decode_from_worker(body: bytes | memoryview) -> FromWorker:
    return _from_worker.decode(body)


class FrameDecoder(frames.FrameDecoder):
    """``corral.frames.FrameDecoder`` with this channel's largest frame."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        super().__init__(max_frame)
