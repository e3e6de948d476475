"""Request bodies of the OpenAI, llama.cpp-router and Nitro routes, and their parsing.

Bodies are read and validated here, once per request (never per token): malformed
JSON is a 400, a wrong type is a 400 that names the field (``param``: e.g.
``messages.0.content``), an option corral does not implement is a 400 that says so.
Unknown fields are ignored (OpenAI clients send fields corral has no use for).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from corral import wire
from corral.errors import InvalidRequest, UnsupportedOption
from corral.settings import ModelSettings, SettingsError

__all__ = [
    "parse_body",
    "ChatMessageIn",
    "ChatCompletionRequest",
    "CompletionRequest",
    "EmbeddingRequest",
    "ModelRef",
    "NitroLoadModel",
    "NitroUnloadModel",
    "nitro_settings",
]

M = TypeVar("M", bound=BaseModel)

_LENIENT = ConfigDict(extra="ignore")


def _error_message(exc: ValidationError) -> tuple[str, str | None]:
    err = exc.errors(include_url=False)[0]
    if err["type"] == "json_invalid":
        return f"the body is not valid JSON: {err['ctx'].get('error', err['msg'])}", None
    if err["type"] == "model_type" and not err["loc"]:
        return "the body must be a JSON object", None
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "list[", "str", "union"))]
    param = ".".join(loc) or None
    msg = "required field is missing" if err["type"] == "missing" else err["msg"]
    return (f"{param}: {msg}" if param else msg), param


async def parse_body(request: Request, model: type[M]) -> M:
    body = await request.body()
    if not body:
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        msg, param = _error_message(exc)
        raise InvalidRequest(msg, param=param) from None


class _TextPart(BaseModel):
    model_config = _LENIENT
    type: str
    text: str | None = None


class ChatMessageIn(BaseModel):
    model_config = _LENIENT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None

    def text(self, index: int) -> str:
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        out = []
        for j, part in enumerate(c):
            if part.type != "text" or part.text is None:
                raise UnsupportedOption(f"content parts of type {part.type!r} are not supported "
                                        "(text only)", param=f"messages.{index}.content.{j}.type")
            out.append(part.text)
        return "".join(out)


class StreamOptions(BaseModel):
    model_config = _LENIENT
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    model_id: str | None = Field(None, min_length=1)  # Nitro
    stream: bool = False
    stream_options: StreamOptions | None = None
    # numeric bounds: wire.SamplingParams's, checked in sampling() (one set with the worker)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = 1
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def model_name(self) -> str:
        name = self.model or self.model_id
        if not name:
            raise InvalidRequest("model: required field is missing (a model id or alias; "
                                 "GET /v1/models lists them)", param="model")
        return name

    def check_common(self) -> None:
        if self.n not in (None, 1):
            raise UnsupportedOption("n > 1 is not supported; send n separate requests", param="n")
        if self.logit_bias:
            raise UnsupportedOption("logit_bias is not supported", param="logit_bias")
        stops = self.stop_list()
        if len(stops) > 4 or any(not s for s in stops):
            raise InvalidRequest("stop: at most 4 non-empty strings", param="stop")

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def sampling(self) -> wire.SamplingParams:
        kw: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                     "presence_penalty", "frequency_penalty", "seed"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        mt = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        params = wire.SamplingParams(max_tokens=mt, stop=self.stop_list(), ignore_eos=self.ignore_eos, **kw)
        bad = wire.invalid_field(params)
        if bad is not None:
            name, msg = bad
            if name == "max_tokens" and self.max_completion_tokens is not None:
                name = "max_completion_tokens"
            raise InvalidRequest(f"{name}: {msg}", param=name)
        return params

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    def check(self) -> None:
        self.check_common()
        if self.logprobs or self.top_logprobs:
            raise UnsupportedOption("logprobs are not supported", param="logprobs")
        if self.tools or self.functions:
            raise UnsupportedOption("tool and function calling are not supported",
                                    param="tools" if self.tools else "functions")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise UnsupportedOption("response_format other than text is not supported",
                                    param="response_format")

    def wire_messages(self) -> list[wire.ChatMessage]:
        return [wire.ChatMessage("system" if m.role == "developer" else m.role, m.text(i))
                for i, m in enumerate(self.messages)]


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    def check(self) -> None:
        self.check_common()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise UnsupportedOption("a list of prompts is not supported; send one prompt per request",
                                    param="prompt")
        if self.echo:
            raise UnsupportedOption("echo is not supported", param="echo")
        if self.suffix:
            raise UnsupportedOption("suffix (fill-in-the-middle) is not supported", param="suffix")
        if self.best_of not in (None, 1):
            raise UnsupportedOption("best_of is not supported", param="best_of")
        if self.logprobs:
            raise UnsupportedOption("logprobs are not supported", param="logprobs")

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class EmbeddingRequest(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    model_id: str | None = Field(None, min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    def model_name(self) -> str:
        name = self.model or self.model_id
        if not name:
            raise InvalidRequest("model: required field is missing", param="model")
        return name

    def inputs(self) -> list[str]:
        if self.dimensions is not None:
            raise UnsupportedOption("dimensions is not supported", param="dimensions")
        inp = self.input
        if isinstance(inp, str):
            inp = [inp]
        if not inp:
            raise InvalidRequest("input: must not be empty", param="input")
        if not all(isinstance(x, str) for x in inp):
            raise UnsupportedOption("token arrays as input are not supported; send text", param="input")
        if len(inp) > 2048:
            raise InvalidRequest("input: at most 2048 items", param="input")
        return list(inp)  # type: ignore[arg-type]


class ModelRef(BaseModel):
    """llama.cpp router: POST /models/load, /models/unload."""
    model_config = _LENIENT
    model: str = Field(min_length=1)


class NitroLoadModel(BaseModel):
    """Nitro's /inferences/llamacpp/loadmodel body. Bounds and defaults of the model
    settings are ``ModelSettings``'s (``nitro_settings``)."""
    model_config = ConfigDict(extra="forbid")
    model_id: str = Field(min_length=1, max_length=128)
    llama_model_path: str = Field(min_length=1)
    ctx_len: int | None = None
    ngl: int | None = None
    embedding: bool | None = None
    pre_prompt: str | None = None
    user_prompt: str | None = None
    ai_prompt: str | None = None
    system_prompt: str | None = None
    n_parallel: int | None = None
    cont_batching: bool | None = None  # always on in corral
    cpu_threads: int | None = None


# Nitro's name -> ModelSettings field
_NITRO_SETTINGS = {"ctx_len": "ctx_len", "ngl": "n_gpu_layers", "embedding": "embedding",
                   "pre_prompt": "pre_prompt", "user_prompt": "user_prompt",
                   "ai_prompt": "ai_prompt", "system_prompt": "system_prompt",
                   "n_parallel": "n_parallel", "cpu_threads": "threads"}


def nitro_settings(body: NitroLoadModel, inherited: ModelSettings) -> ModelSettings:
    """The body's settings over ``inherited``; a bad value is a 400 naming Nitro's key."""
    given = {ours: getattr(body, theirs) for theirs, ours in _NITRO_SETTINGS.items()
             if getattr(body, theirs) is not None}
    try:
        return ModelSettings.layered([inherited.to_dict(), given])
    except SettingsError as exc:
        key, msg = exc.errors[0]
        param = next(t for t, o in _NITRO_SETTINGS.items() if o == key)
        raise InvalidRequest(f"{param}: {msg}", param=param) from None


class NitroUnloadModel(BaseModel):
    model_config = _LENIENT
    model_id: str = Field(min_length=1)
