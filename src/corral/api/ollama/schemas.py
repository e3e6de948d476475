"""Ollama request bodies and their translation to corral's wire request.

``options`` map onto ``wire.SamplingParams`` (num_predict, temperature, top_k, top_p,
min_p, seed, stop, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty);
``num_ctx`` sizes a chat's context within the slot's (corral.api.ollama.context: the
oldest turns dropped to fit unless ``truncate`` is false; generation capped to what is left);
on /api/generate a larger value is taken as the slot's. Options corral has no use for
(num_gpu, num_thread, mirostat, ...) are ignored, as Ollama ignores options a runner
does not support. ``keep_alive`` is a Go duration ("5m", "1h30m", "0") or seconds. ``format`` ("json" or a
JSON schema) and ``tools`` go through corral's structured output and tool calling.
"""

from __future__ import annotations

import binascii

import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.api.core.audio import is_audio
from corral.api.core.images import data_url
from corral.api.core.schemas import CacheSalt
from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["OllamaOptions", "OllamaChatRequest", "OllamaGenerateRequest", "OllamaEmbedRequest",
           "OllamaEmbeddingsRequest", "OllamaModelRequest", "OllamaPullRequest", "OllamaCopyRequest",
           "parse_keep_alive", "KEEP_ALIVE_MAX_S", "SPELLING", "OPTION_NAMES", "sampling_from_options"]

_LENIENT = ConfigDict(extra="ignore")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


# Go's time.Duration holds at most 2^63-1 ns (about 292 years): Ollama refuses a longer
# duration string ("invalid duration"), and so does corral, for numbers too
KEEP_ALIVE_MAX_S = (2**63 - 1) / 1e9


def parse_keep_alive(value: float | str | None) -> float | None:
    """Seconds (negative: forever) from a number of seconds or a Go duration string.
    NaN, infinities and a duration longer than Go's (``KEEP_ALIVE_MAX_S``) are 400s
    naming ``keep_alive``; a negative one of any size is "forever" (-1)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad_keep_alive(value)
    if isinstance(value, (int, float)):
        return _bounded(float(value) if isinstance(value, float) else _int_s(value), value)
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return _bounded(sign * float(body), value)  # "0", "300": seconds
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(body) or not body:
        raise _bad_keep_alive(value)
    return _bounded(sign * total, value)


def _int_s(value: int) -> float:
    if abs(value) > KEEP_ALIVE_MAX_S:  # 10**400 is no float: judge it as an int
        return math.copysign(math.inf, value)
    return float(value)


def _bounded(seconds: float, value: object) -> float:
    if math.isnan(seconds):
        raise _bad_keep_alive(value)
    if seconds < 0:
        return -1.0  # forever, however negative
    if seconds > KEEP_ALIVE_MAX_S:
        raise InvalidRequest(f"keep_alive: {_shown(value)} is longer than the longest duration "
                             f"({KEEP_ALIVE_MAX_S:.0f} s, about 292 years); a negative value keeps the "
                             "model loaded", param="keep_alive")
    return seconds


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad_keep_alive(value: object) -> InvalidRequest:
    return InvalidRequest(f"keep_alive: {_shown(value)} is not a duration; write e.g. \"5m\", \"1h\", "
                          "\"0\" or a number of seconds (negative: keep loaded)", param="keep_alive")


class OllamaOptions(BaseModel):
    model_config = _LENIENT
    num_ctx: int | None = Field(None, ge=1)
    num_predict: int | None = Field(None, ge=-2)
    temperature: float | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    min_p: float | None = Field(None, ge=0, le=1)
    typical_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: list[str] | str | None = None
    repeat_penalty: float | None = Field(None, ge=0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    ignore_eos: bool = False  # corral's extension (as on its OpenAI routes): generate every token


# Ollama's names of the wire.SamplingParams fields its options name otherwise
SPELLING = {"max_tokens": "num_predict"}

# the wire field each option fills, for a 400 of the wire's bounds (api/core/generation.py's check_bounds)
OPTION_NAMES = {**{f"params.{f}": f"options.{name}" for f, name in wire.spelled(SPELLING).items()
                   if name in OllamaOptions.model_fields}, "thinking_budget": "think"}


def sampling_from_options(opts: OllamaOptions | None, slot_ctx: int) -> wire.SamplingParams:
    """``options`` -> sampling parameters; ``slot_ctx``: the context one slot holds."""
    if opts is None:
        return wire.SamplingParams()
    last_n = slot_ctx if opts.repeat_last_n == -1 else opts.repeat_last_n
    # -1 (forever) and -2 (fill the context): no limit
    limit = opts.num_predict if opts.num_predict is not None and opts.num_predict >= 0 else None
    stops = [opts.stop] if isinstance(opts.stop, str) else list(opts.stop or [])
    if any(not s for s in stops):
        raise InvalidRequest("options.stop: stop strings must not be empty", param="options.stop")
    return wire.sampling_from(vars(opts), SPELLING, repeat_last_n=last_n, max_tokens=limit,
                              stop=None if opts.stop is None else stops)


class _Generating(BaseModel):
    model_config = _LENIENT
    model: str = Field(min_length=1)
    stream: bool = True
    options: OllamaOptions | None = None
    format: Literal["", "json"] | dict[str, Any] | None = None
    keep_alive: float | str | None = None
    # thinking models: true/false, or a level (a budget from the model's reasoning_levels);
    # unset: the model's default. ``message.thinking`` / ``thinking`` carry the thoughts.
    think: bool | Literal["low", "medium", "high"] | None = None
    cache_salt: CacheSalt | None = None  # corral's extension (vLLM's name): share the prompt cache only with it

    def check_common(self) -> None:
        pass

    def reasoning(self) -> dict[str, Any] | None:
        """``think`` as the worker's fields (a model that cannot think refuses true or a level)."""
        if self.think is None:
            return None
        if isinstance(self.think, bool):
            return {"think": self.think}
        return {"think": True, "reasoning_effort": self.think}

    def response_format(self) -> dict[str, Any] | None:
        """``format``: "json" (any JSON object) or a JSON schema the output must match."""
        if not self.format:
            return None
        if self.format == "json":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": self.format}}

    def keep_alive_s(self) -> float | None:
        return parse_keep_alive(self.keep_alive)


class OllamaToolCallFunction(BaseModel):
    model_config = _LENIENT
    name: str
    arguments: dict[str, Any] | str = {}


class OllamaToolCall(BaseModel):
    model_config = _LENIENT
    function: OllamaToolCallFunction


class OllamaMessage(BaseModel):
    model_config = _LENIENT
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[Any] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None  # an assistant turn's thoughts (templates that render them get them)


class OllamaChatRequest(_Generating):
    messages: list[OllamaMessage] = []
    tools: list[dict[str, Any]] | None = None
    truncate: bool = True  # with options.num_ctx: drop the oldest turns to fit (false: refuse)

    def check(self) -> None:
        self.check_common()

    def openai_messages(self) -> list[dict[str, Any]]:
        """The messages in OpenAI's chat shape: tool calls get ids, a tool result answers
        the latest call of its tool_name."""
        out: list[dict[str, Any]] = []
        ids: dict[str, str] = {}
        for i, m in enumerate(self.messages):
            msg: dict[str, Any] = {"role": m.role, "content": _content(m.content or "", m.images,
                                                                      f"messages.{i}.images")}
            if m.thinking and m.role == "assistant":
                msg["reasoning_content"] = m.thinking
            if m.tool_calls:
                calls = []
                for j, c in enumerate(m.tool_calls):
                    cid = f"call_{i}_{j}"
                    ids[c.function.name] = cid
                    args = c.function.arguments
                    calls.append({"id": cid, "type": "function", "function": {
                        "name": c.function.name, "arguments": args if isinstance(args, str) else json.dumps(args)}})
                msg["tool_calls"] = calls
            if m.role == "tool" and m.tool_name:
                msg["name"] = m.tool_name
                msg["tool_call_id"] = ids.get(m.tool_name)
            out.append(msg)
        return out


class OllamaGenerateRequest(_Generating):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None

    def check(self) -> None:
        self.check_common()
        if self.images and self.suffix is not None:
            raise UnsupportedOption("images cannot be combined with suffix (fill-in-the-middle)", param="images")
        if self.template:
            raise UnsupportedOption("template is not supported: corral renders prompts with the model's "
                                    "chat template or its configured chat_template", param="template")
        if self.context:
            raise UnsupportedOption("context (the deprecated token memory) is not supported; use /api/chat",
                                    param="context")
        if self.raw and self.system:
            raise InvalidRequest("system has no effect with raw=true (the prompt is sent as it is)",
                                 param="system")

    def openai_input(self) -> tuple[str | None, list[dict[str, Any]]]:
        """(raw prompt, messages): raw sends the prompt as it is; otherwise, as Ollama does,
        the prompt is a user turn (after ``system``) rendered by the model's template."""
        turn = {"role": "user", "content": _content(self.prompt, self.images, "images")}
        if self.raw:  # the images' markers go before the prompt unless it places them itself
            marks = "" if wire.MEDIA_MARKER in self.prompt else wire.MEDIA_MARKER * len(self.images or [])
            return marks + self.prompt, [turn] if self.images else []
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return None, [*msgs, turn]


def _sniffs_audio(b64: str) -> bool:
    head = "".join(b64[:64].split())[:24]  # 18 bytes: enough for every signature sniff() reads
    try:
        return is_audio(binascii.a2b_base64(head[: len(head) // 4 * 4]))
    except (binascii.Error, ValueError):
        return False


def _content(text: str, images: list[Any] | None, where: str) -> str | list[dict[str, Any]]:
    """A turn's content in OpenAI's shape: its images (base64) first, as Ollama places them, then the
    text. An entry may be a recording (Ollama sniffs the media type of each): it becomes an
    ``input_audio`` part (api/core/audio.py)."""
    if not images:
        return text
    parts: list[dict[str, Any]] = []
    for k, img in enumerate(images):
        if not isinstance(img, str):
            raise InvalidRequest(f"{where}.{k}: an image is a base64 string", param=f"{where}.{k}")
        if _sniffs_audio(img):
            parts.append({"type": "input_audio", "input_audio": {"data": img}, "field": f"{where}.{k}"})
        else:
            parts.append({"type": "image_url", "image_url": {"url": data_url(img)}, "field": f"{where}.{k}"})
    return [*parts, {"type": "text", "text": text}]


class OllamaEmbedRequest(BaseModel):
    model_config = _LENIENT
    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: bool = True
    options: OllamaOptions | None = None
    keep_alive: float | str | None = None
    dimensions: int | None = None

    def inputs(self) -> list[str]:
        if self.dimensions is not None:
            raise UnsupportedOption("dimensions is not supported", param="dimensions")
        items = [self.input] if isinstance(self.input, str) else list(self.input)
        if not items:
            raise InvalidRequest("input: must not be empty", param="input")
        return items


class OllamaEmbeddingsRequest(BaseModel):
    model_config = _LENIENT
    model: str = Field(min_length=1)
    prompt: str
    options: OllamaOptions | None = None
    keep_alive: float | str | None = None


class OllamaModelRequest(BaseModel):
    """/api/show and /api/delete: ``model`` (``name`` in older clients)."""
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    name: str | None = Field(None, min_length=1)
    verbose: bool = False

    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise InvalidRequest("model: required field is missing", param="model")
        return name


class OllamaPullRequest(OllamaModelRequest):
    stream: bool = True
    insecure: bool = False


class OllamaCopyRequest(BaseModel):
    model_config = _LENIENT
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1)
