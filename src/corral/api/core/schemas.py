"""Request bodies of the OpenAI, llama.cpp-router and Nitro routes, and their parsing.

Bodies are read and validated here, once per request (never per token): malformed
JSON is a 400, a wrong type is a 400 that names the field (``param``: e.g.
``messages.0.content``), an option corral does not implement is a 400 that says so.
Unknown fields are ignored (OpenAI clients send fields corral has no use for).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request

from corral import wire
from corral.api.core.lora import LoraList
from corral.api.http import invalid_request
from corral.errors import InvalidRequest, UnsupportedOption
from corral.model.settings import ModelSettings, SettingsError

__all__ = [
    "parse_body",
    "CacheSalt",
    "MAX_CACHE_SALT_CHARS",
    "SamplingFields",
    "StreamOptions",
    "CompletionRequest",
    "MAX_CHOICES",
    "EmbeddingRequest",
    "ModelRef",
    "NitroLoadModel",
    "NitroUnloadModel",
    "nitro_settings",
]

M = TypeVar("M", bound=BaseModel)

_LENIENT = ConfigDict(extra="ignore")


async def parse_body(request: Request, model: type[M], *, empty_ok: bool = False) -> M:
    """The one reading of a JSON body into ``model`` (a ``RootModel`` for a body that is no
    object); every problem a 400 naming the field (``corral.api.http.invalid_request``).
    ``empty_ok``: an empty body reads as ``{}``."""
    body = await request.body()
    if not body.strip():
        if not empty_ok:
            raise InvalidRequest("the request body is empty; send a JSON body")
        body = b"{}"
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise invalid_request(exc.errors(include_url=False)) from None


class StreamOptions(BaseModel):
    model_config = _LENIENT
    include_usage: bool = False


MAX_CHOICES = 16  # n (times the prompts of a completions request)

MAX_CACHE_SALT_CHARS = 256
# vLLM's and llama-server's ``cache_salt``: only requests of the same key (or cache_group) and
# the same salt share cached prompt prefixes (control/keys/cache_tenant.py). A string (not coerced
# from a number), 1-256 characters; anything else is a 400 naming ``cache_salt``.
CacheSalt = Annotated[str, Field(min_length=1, max_length=MAX_CACHE_SALT_CHARS, strict=True)]


class SamplingFields(BaseModel):
    """The sampling fields chat and completions share (and their checks)."""
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    model_id: str | None = Field(None, min_length=1)  # Nitro
    stream: bool = False
    stream_options: StreamOptions | None = None
    # numeric bounds: wire.SamplingParams's, checked by generation.check_bounds (one set with the worker)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    dry_multiplier: float | None = None  # llama-server's DRY
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    ignore_eos: bool = False
    speculative: bool | None = None  # corral: draft and verify (the model's speculative setting)
    t_max_predict_ms: int = Field(0, ge=0, le=1 << 40)  # llama-server's generation time limit (ms; 0: none)
    lora: LoraList | None = None  # llama-server's [{id, scale}] (api/core/lora.py)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    cache_salt: CacheSalt | None = None  # shares the prompt cache only with the same salt

    def wire_lora(self) -> list[wire.LoraScale] | None:
        """The adapter scales as given (ids checked against the model in lora.route)."""
        return None if self.lora is None else [wire.LoraScale(e.id, e.scale) for e in self.lora]

    def model_name(self) -> str:
        name = self.model or self.model_id
        if not name:
            raise InvalidRequest("model: required field is missing (a model id or alias; "
                                 "GET /v1/models lists them)", param="model")
        return name

    def check_common(self) -> None:
        stops = self.stop_list()
        if len(stops) > 4 or any(not s for s in stops):
            raise InvalidRequest("stop: at most 4 non-empty strings", param="stop")
        self.token_bias()

    def token_bias(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                token = -1
            if token < 0:
                raise InvalidRequest(f"logit_bias: keys are token ids (non-negative integers), got {key!r}",
                                     param="logit_bias")
            if not -100.0 <= value <= 100.0:
                raise InvalidRequest(f"logit_bias: values must be between -100 and 100, got {value}",
                                     param=f"logit_bias.{key}")
            out[token] = value
        return out

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def sampling(self) -> wire.SamplingParams:
        """The wire's fields under their own names (OpenAI's and llama-server's); each knob left
        out is the model's default (corral.control.generation_defaults). Bounds: checked once
        for the whole request (api/core/generation.py's check_bounds)."""
        return wire.sampling_from(vars(self), max_tokens=self.max_new_tokens(),
                                  stop=None if self.stop is None else self.stop_list(), logit_bias=self.token_bias())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


TokenArray = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | TokenArray | list[TokenArray]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None

    def check(self) -> None:
        self.check_common()
        if self.suffix is not None and any(not isinstance(p, str) for p in self.prompts()):
            raise InvalidRequest("suffix: fill-in-the-middle takes text prompts, not token ids", param="suffix")
        if self.best_of not in (None, 1) and self.best_of != self.n:
            raise UnsupportedOption("best_of is not supported (corral returns every choice it "
                                    "generates; use n)", param="best_of")
        if not self.prompts():
            raise InvalidRequest("prompt: must not be empty", param="prompt")
        if len(self.prompts()) * self.n > MAX_CHOICES:
            raise InvalidRequest(f"prompt: at most {MAX_CHOICES} choices per request "
                                 "(prompts times n)", param="prompt")
        if self.max_new_tokens() == 0 and not self.echo:
            raise InvalidRequest("max_tokens: must be at least 1 (0 only with echo)", param="max_tokens")
        if self.grammar is not None and self.json_schema is not None:
            raise InvalidRequest("grammar and json_schema: give at most one", param="grammar")

    def prompts(self) -> list[str | list[int]]:
        """One prompt per entry: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            return []
        out: list[str | list[int]] = []
        ints: list[int] = []
        for x in p:
            if isinstance(x, int):
                ints.append(x)
            else:
                out.append(x)
        return [ints] if ints else out


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
        texts = [x for x in inp if isinstance(x, str)]
        if len(texts) != len(inp):
            raise UnsupportedOption("token arrays as input are not supported; send text", param="input")
        if len(texts) > 2048:
            raise InvalidRequest("input: at most 2048 items", param="input")
        return texts


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
        param = next((t for t, o in _NITRO_SETTINGS.items() if o == key), key)
        raise InvalidRequest(f"{param}: {msg}", param=param) from None


def nitro_changes(body: NitroLoadModel, settings: ModelSettings) -> list[tuple[str, Any, Any]]:
    """(Nitro's key, the body's value, ``settings``' value) for each setting the body gives
    that ``settings`` has otherwise."""
    return [(theirs, getattr(body, theirs), getattr(settings, ours)) for theirs, ours in _NITRO_SETTINGS.items()
            if getattr(body, theirs) is not None and getattr(body, theirs) != getattr(settings, ours)]


class NitroUnloadModel(BaseModel):
    model_config = _LENIENT
    model_id: str = Field(min_length=1)
