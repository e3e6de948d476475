"""Model settings: the one type that says how a model is run, with every default and bound.

``ModelSettings`` is used everywhere a model's settings appear:

- the config file (``[defaults]`` and ``[models.ID]`` tables; ``corral.config.file``),
- the catalog (``corral.control.catalog.ModelSpec`` extends it with id, path, aliases),
- the wire (``corral.wire.WorkerSettings`` extends it with what one spawn needs),
- the Nitro ``loadmodel`` route (its body's fields map onto these names).

To add a setting, add ONE field here (type, default, bounds in ``Meta``); everything
above picks it up. A field the worker does not need to restart for belongs in
``LIVE_FIELDS`` too. Unknown keys are an error that names the key
(``check_partial``); a value out of bounds is an error that names the key and the
bound.

This module imports nothing of corral: ``corral.wire`` (which the worker imports)
depends on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import msgspec
from msgspec import Meta

from corral.units import parse_bytes

__all__ = ["ModelSettings", "LoraAdapter", "Turn", "MAX_LORA", "LORA_SCALE_MAX", "SettingsError", "LIVE_FIELDS", "VISIBLE_DEVICES_VARS", "KV_CACHE_TYPES", "CacheType", "INT32_MAX", "UINT32_MAX", "DEFAULT_SLOT_CTX",
           "BYTE_FIELDS", "PROMPT_FIELDS", "SAMPLING_BUILTIN", "SAMPLING_KEYS", "GENERATION_FIELDS", "MAX_STOPS",
           "setting_names"]

INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1

_Positive32 = Annotated[int, Meta(ge=1, le=INT32_MAX)]

# KV cache element types llama-server accepts (--cache-type-k/-v), and each one's bytes
# per block and elements per block
KV_CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f16": (2, 1), "f32": (4, 1), "bf16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32), "q4_1": (20, 32),
    "iq4_nl": (18, 32), "q5_0": (22, 32), "q5_1": (24, 32)}
CacheType = Literal["f16", "f32", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


# context per slot of a model whose ctx_len is not set (Claude Code's prompts are 19k-28k
# tokens, Open WebUI's tool definitions 6.4k): capped at the model's n_ctx_train, fitted to
# memory under n_gpu_layers = "auto" (docs/internals/worker-engine.md, "The slot context")
DEFAULT_SLOT_CTX = 32768
MIN_CTX_LEN = 16  # a ctx_len that is set
MAX_LORA = 32  # adapters per model
LORA_SCALE_MAX = 100.0  # |scale| of an adapter, in the config and in a request


# The sampling knobs: one bound each, shared by a model's defaults (``ModelSettings``) and
# a request's own values (``corral.wire.SamplingParams``); llama-server's names differ only
# in dashes (``top-k``), Ollama's ``PARAMETER`` names are these.
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]  # 0: greedy
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
TopK = Annotated[int, Meta(ge=0, le=INT32_MAX)]  # 0: off
RepeatPenalty = Annotated[float, Meta(gt=0.0, le=100.0)]
LastN = Annotated[int, Meta(ge=-1, le=INT32_MAX)]  # -1: the whole context
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
DryMultiplier = Annotated[float, Meta(ge=0.0, le=100.0)]  # 0: DRY off
DryBase = Annotated[float, Meta(ge=1.0, le=100.0)]
DryLength = Annotated[int, Meta(ge=0, le=INT32_MAX)]
MAX_STOPS = 16  # stop strings (of a model's defaults; a request's own: its API's limit)
StopList = Annotated[list[Annotated[str, Meta(min_length=1, max_length=1024)]], Meta(max_length=MAX_STOPS)]
Breakers = Annotated[list[Annotated[str, Meta(min_length=1, max_length=64)]], Meta(max_length=64)]

# what a request that sets none of them samples with (llama-server's defaults)
SAMPLING_BUILTIN: dict[str, Any] = {
    "temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "typical_p": 1.0,
    "repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", "\"", "*"], "stop": []}
SAMPLING_KEYS = tuple(SAMPLING_BUILTIN)


class Turn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A turn of a model's opening conversation (Ollama's ``MESSAGE``)."""

    role: Literal["user", "assistant", "system"]
    content: Annotated[str, Meta(max_length=1 << 20)]


class LoraAdapter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A LoRA adapter GGUF of a model (llama-server's ``--lora-scaled FILE SCALE``), loaded
    once per worker (worker/lora/adapters.py). ``id`` names it in requests (as does its position, which
    is llama-server's integer id); ``scale`` is its default; ``model``: an extra model id that
    is this model with only this adapter at ``scale`` (Ollama's ``ADAPTER``), served by the
    same workers; such an adapter is then off by default for the model's own requests
    (docs/internals/lora.md)."""

    id: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    path: Annotated[str, Meta(min_length=1)]
    scale: Annotated[float, Meta(ge=-LORA_SCALE_MAX, le=LORA_SCALE_MAX)] = 1.0
    model: Annotated[str, Meta(min_length=1, max_length=256)] | None = None


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How one model is run. Defaults here are the only defaults."""

    # KV cells. With a number of slots (n_parallel = N): the total, a slot gets ctx_len // N;
    # with n_parallel = "auto": one slot's context. 0 (the default): unset, DEFAULT_SLOT_CTX a
    # slot; the worker caps a slot at the model's n_ctx_train, and n_gpu_layers = "auto"
    # shrinks it to fit the GPU or, with no GPU, the host's RAM (worker/fit.py)
    ctx_len: Annotated[int, Meta(ge=0, le=INT32_MAX)] = 0
    # slots: sequences decoded together. "auto": as many as the memory the plan leaves after
    # the weights holds, each with its whole context, at most n_parallel_max (corral/fit/slots.py)
    n_parallel: Annotated[int, Meta(ge=1, le=256)] | Literal["auto"] = "auto"
    n_parallel_max: Annotated[int, Meta(ge=1, le=256)] = 64  # n_parallel = "auto": the most slots
    instances: Annotated[int, Meta(ge=1, le=64)] = 1  # worker processes of this model
    n_batch: _Positive32 = 512  # max tokens per llama_decode
    # layers on the GPU: a number (-1: all), or "auto": fit layers and context to the
    # device's free memory (corral/fit/plan.py's plan_fit); with no GPU, auto is 0
    n_gpu_layers: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | Literal["auto"] = "auto"
    # GPUs of each instance (CUDA_VISIBLE_DEVICES and the HIP/Vulkan equivalents); None: all
    devices: list[Annotated[int, Meta(ge=0, le=1023)]] | None = None
    # with several ``devices``: each one's proportion of the GPU layers, one per GPU in their
    # order (like llama-server's --tensor-split, e.g. [3, 1]); None: the router splits an
    # "auto" model by the GPUs' budgets and a fixed n_gpu_layers by their free memory
    tensor_split: list[Annotated[float, Meta(ge=0, le=1e12)]] | None = None
    fit_ctx_floor: Annotated[int, Meta(ge=16, le=INT32_MAX)] = 1024  # auto: context per slot kept at least
    threads: _Positive32 | None = None  # None: see corral.control.catalog.default_threads
    threads_batch: _Positive32 | None = None  # None: same as threads
    # threads that sample the slots of one step side by side (worker/sampling/pool.py); "auto":
    # min(n_parallel, CPUs, 4) with no GPU layers, else min(n_parallel, CPUs, 8). Never
    # more than the cores the thread governor finds free at that moment.
    sampling_threads: Annotated[int, Meta(ge=1, le=256)] | Literal["auto"] = "auto"
    flash_attn: bool | None = None  # None: llama.cpp decides (the model and its projector)
    # sliding-window layers keep every position (llama-server's --swa-full): more KV memory
    # (Gemma 3 270M at 2 x 8192 cells: 144 MiB, not 54), and a cached prefix is reusable at
    # any length, not only while its last window is still there (a shared system prompt)
    swa_full: bool = False
    # KV cache element types (llama-server's --cache-type-k/-v, Ollama's OLLAMA_KV_CACHE_TYPE):
    # q8_0 takes 53% of f16's memory, q4_0 28%; a quantized V cache needs flash attention
    # (with flash_attn unset llama.cpp turns it on; flash_attn = false is refused at load)
    cache_type_k: CacheType = "f16"
    cache_type_v: CacheType = "f16"
    embedding: bool = False
    # how embeddings pool a sequence's hidden states (llama-server's --pooling): None: the
    # GGUF's own ({arch}.pooling_type, rank for a reranker), else mean; "rank" serves /v1/rerank
    pooling: Literal["none", "mean", "cls", "last", "rank"] | None = None
    # prompt template: chat_template overrides the model's own tokenizer.chat_template;
    # the others shape the plain Nitro-style prompt of models without one
    chat_template: str | None = None
    # how long one render of the chat template may run (docs/internals/dialects.md): past
    # it the request is refused with 400 invalid_request
    chat_template_time_s: Annotated[float, Meta(gt=0, le=60)] = 2.0
    pre_prompt: str | None = None
    user_prompt: str | None = None
    ai_prompt: str | None = None
    system_prompt: str | None = None
    seed: Annotated[int, Meta(ge=0, le=UINT32_MAX)] | None = None  # for requests that give none
    # generation defaults (docs/guide/configuration.md, "Generation defaults"): what a
    # request that sets none of these samples with; None: corral's built-in
    # (SAMPLING_BUILTIN, llama-server's). A request's own value always wins.
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: TopK | None = None
    min_p: Probability | None = None
    typical_p: Probability | None = None  # 1: off
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: LastN | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # DRY ("don't repeat yourself", llama-server's --dry-*): multiplier 0 is off
    dry_multiplier: DryMultiplier | None = None
    dry_base: DryBase | None = None
    dry_allowed_length: DryLength | None = None
    dry_penalty_last_n: LastN | None = None
    dry_sequence_breakers: Breakers | None = None
    stop: StopList | None = None  # stop strings of a request that gives none
    # the system message of a chat request that sends none (Ollama's SYSTEM)
    system: Annotated[str, Meta(max_length=1 << 20)] | None = None
    # variables every chat template render gets (llama-server's --chat-template-kwargs,
    # e.g. {enable_thinking = false}); a request's chat_template_kwargs win key by key
    chat_template_kwargs: dict[str, Any] | None = None
    # turns every chat request starts with, after the system message (Ollama's MESSAGE)
    messages: Annotated[list[Turn], Meta(max_length=256)] | None = None
    # tokens generated for a request that sets no limit (llama-server's -n, Ollama's
    # num_predict); None: until the slot's context is full
    default_max_tokens: Annotated[int, Meta(ge=1, le=INT32_MAX)] | None = None
    # reasoning (docs/internals/reasoning.md): the thinking markup the worker splits from the
    # answer ("auto": detected from the chat template; "none": the thoughts stay in the text,
    # as llama-server's --reasoning-format none); the thinking budget of a request that sets
    # none (-1: unlimited; 0: no thinking unless asked), the most a request may set (None: no
    # cap), and the budget of each effort level (OpenAI reasoning_effort, Ollama think)
    reasoning_format: Literal["auto", "none", "deepseek", "magistral", "command-r", "seed", "harmony"] = "auto"
    reasoning_budget: Annotated[int, Meta(ge=-1, le=INT32_MAX)] = -1
    reasoning_budget_max: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    reasoning_levels: dict[str, Annotated[int, Meta(ge=0, le=INT32_MAX)]] = msgspec.field(
        default_factory=lambda: {"minimal": 256, "low": 1024, "medium": 4096, "high": 16384})
    verbose: bool = False  # the worker prints llama.cpp's whole log
    # vision: the multimodal projector GGUF (llama-server's --mmproj); None: one found next to
    # the model file by its name (``mmproj-*.gguf``), else none
    mmproj: str | None = None
    # LoRA adapters (llama-server's --lora), each loaded once per worker; a request picks
    # scales with "lora": [{id, scale}] (docs/internals/lora.md). Relative paths: as ``path``
    lora: Annotated[list[LoraAdapter], Meta(max_length=MAX_LORA)] = []
    # speculative decoding (worker/speculation/speculator.py): "ngram" drafts from the slot's own prompt
    # and output, "draft" with a smaller model of the same vocabulary (worker/speculation/draft.py), both
    # verified in the step's one decode; "off": one token per slot and step.
    # Requests may turn it off (or on, where the model has it) with "speculative".
    speculative: Literal["ngram", "draft", "off"] = "off"
    draft_max: Annotated[int, Meta(ge=1, le=64)] = 16  # tokens drafted per slot and step at most
    draft_min: Annotated[int, Meta(ge=1, le=64)] = 2  # a shorter draft is not tried
    # speculative = "draft": the draft GGUF (a path; relative: to the model file's folder), its
    # layers on the GPU (None: all where the model has GPU layers, else none; it runs on the
    # model's GPUs), and the draft model's probability below which a draft stops (llama-server's
    # --draft-p-min)
    draft_model: str | None = None
    draft_n_gpu_layers: Annotated[int, Meta(ge=-1, le=INT32_MAX)] | None = None
    draft_p_min: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.75
    # with [server] ray_address: custom Ray resources each instance asks for (e.g. a node tag)
    ray_resources: dict[str, Annotated[float, Meta(ge=0)]] = {}
    # the host-RAM prompt cache (llama-server's --cache-ram; worker/cache/prompt_cache.py): bytes of
    # saved prefixes' KV each worker keeps (a size, "2GiB", or bytes; 0: off). The same budget
    # holds sequences paused by fair-share preemption (worker/cache/kv_store.py).
    prompt_cache_ram: Annotated[int, Meta(ge=0, le=2**50)] = 1024**3
    # variants (control/plane.py's serving): false, an id equal to a loaded model in all a load
    # fixes runs on that model's instances; true, this model runs only on workers of its own and
    # no other id runs on them (fixed per load: two ids that both set it are two models)
    own_instances: bool = False
    # router only (changing these needs no worker restart)
    ttl_s: Annotated[float, Meta(gt=0)] | None = None  # unload after this long idle
    # an unload lets running requests finish this long (llama-server preset's stop-timeout);
    # None: [server] drain_timeout_s
    drain_timeout_s: Annotated[float, Meta(ge=0, le=86400)] | None = None
    pinned: bool = False  # never evicted
    load_on_startup: bool = False

    def __post_init__(self) -> None:
        if 0 < self.ctx_len < MIN_CTX_LEN:  # msgspec's ValidationError, with the key's path
            raise ValueError(f"Expected `int` >= {MIN_CTX_LEN}, or 0 (unset: {DEFAULT_SLOT_CTX} a slot)")
        if self.ctx_len == 0:  # not set: sized per slot
            n = 1 if self.n_parallel == "auto" else self.n_parallel
            msgspec.structs.force_setattr(self, "ctx_len", n * DEFAULT_SLOT_CTX)

    def slot_ctx(self) -> int:
        """The context one slot asks for: ``ctx_len // n_parallel``, or with ``"auto"``
        ``ctx_len`` itself (before the worker caps it at ``n_ctx_train`` and fits it)."""
        return self.ctx_len if self.n_parallel == "auto" else max(1, self.ctx_len // self.n_parallel)

    def slots_asked(self) -> int | None:
        """The slots set (``n_parallel``), or None for ``"auto"`` (the worker plans them)."""
        return None if self.n_parallel == "auto" else self.n_parallel

    @classmethod
    def check_partial(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Validate some settings (a config table, command-line overrides, a request
        body). Returns them (converted); ``SettingsError`` names every bad key."""
        errors: list[tuple[str, str]] = []
        out: dict[str, Any] = {}
        fields = setting_names()
        for key, value in values.items():
            if key not in fields:
                errors.append((key, "unknown key (check the spelling)"))
                continue
            try:
                if key in BYTE_FIELDS:
                    value = parse_bytes(value)
                got = getattr(msgspec.convert({key: value}, cls), key)
                out[key] = 0 if key == "ctx_len" and value == 0 else got  # unset stays unset until layered
            except ValueError as exc:  # msgspec.ValidationError is one too
                msg = _strip_path(str(exc))
                if msg.startswith("Invalid enum value"):
                    msg += f" (allowed: {_choices(key)})"
                errors.append((key, msg))
        if errors:
            raise SettingsError(errors)
        return out

    @classmethod
    def layered(cls, layers: Iterable[Mapping[str, Any]]) -> "ModelSettings":
        """Later layers win; a key absent from every layer keeps its default."""
        merged: dict[str, Any] = {}
        for layer in layers:
            merged.update(cls.check_partial(layer))
        out = msgspec.convert(merged, cls)
        out.check_across()
        return out

    def check_across(self) -> None:
        """The rules between settings (``SettingsError``): ``tensor_split`` gives one
        proportion, not all zero, per GPU of ``devices``; a quantized V cache needs flash
        attention (llama.cpp refuses it without); ``speculative = "draft"`` names a ``draft_model``."""
        errors: list[tuple[str, str]] = []
        split, devices = self.tensor_split, self.devices
        if split is not None and (devices is None or len(split) != len(devices) or not any(split)):
            has = "no devices" if devices is None else f"devices = {devices}"
            errors.append(("tensor_split", f"{split} needs one proportion per GPU of devices, not all 0 "
                                           f"(the model has {has})"))
        if self.flash_attn is False and KV_CACHE_TYPES[self.cache_type_v][1] > 1:
            errors.append(("cache_type_v", f"{self.cache_type_v} (a quantized V cache) needs flash attention: "
                                           "leave flash_attn unset or set it to true"))
        if self.speculative == "draft" and not self.draft_model:
            errors.append(("draft_model", 'speculative = "draft" needs draft_model (the draft GGUF\'s path)'))
        ids = [a.id for a in self.lora]
        if len(set(ids)) != len(ids):
            errors.append(("lora", f"adapter ids must be unique, got {ids}"))
        if errors:
            raise SettingsError(errors)

    def settings(self) -> "ModelSettings":
        """Just the model settings (a subclass instance loses its extra fields)."""
        return ModelSettings(**{f: getattr(self, f) for f in ModelSettings.__struct_fields__})

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in ModelSettings.__struct_fields__}

    def device_env(self, seen: Mapping[str, str] | None = None) -> dict[str, str]:
        """The variables that pin a worker to ``devices`` (CUDA, ROCm/HIP, Vulkan); none
        when unset (the worker sees every device).

        GPU ``k`` is the ``k``-th GPU the spawning process sees: where ``seen`` (its
        environment) already sets some of these variables (``CUDA_VISIBLE_DEVICES=2,3
        corral serve``), ``k`` picks the ``k``-th entry of each list it sets, so the
        worker stays on the GPUs the user gave the server, and the variables it does not
        set stay unset (ROCm honours both HIP's and CUDA's: a raw ``k`` in the other one
        would pick the machine's GPU ``k`` again). An index past the list picks nothing
        (the router refuses such a pin before a spawn: ``control/placement/gpus.py``)."""
        if self.devices is None:
            return {}
        given = {var: seen[var] for var in VISIBLE_DEVICES_VARS if seen is not None and var in seen}
        if not given:
            v = ",".join(str(d) for d in self.devices)
            return {var: v for var in VISIBLE_DEVICES_VARS}
        out = {}
        for var, listed in given.items():
            entries = [x.strip() for x in listed.split(",") if x.strip()]
            out[var] = ",".join(entries[d] for d in self.devices if d < len(entries))
        return out

    def worker_key(self) -> tuple[Any, ...]:
        """The settings whose change needs the worker restarted."""
        return tuple(getattr(self, f) for f in ModelSettings.__struct_fields__
                     if f not in LIVE_FIELDS and f not in GENERATION_FIELDS and f not in ROUTER_LOAD_FIELDS)

    def load_key(self) -> tuple[Any, ...]:
        """What a load fixes: two models equal in it (and in their file) are variants, served
        by one model's instances (the rest, PROMPT_FIELDS too, a request carries)."""
        return tuple((tuple((a.id, a.path, a.model) for a in self.lora) if f == "lora" else getattr(self, f))
                     for f in ModelSettings.__struct_fields__  # an adapter's scale a request carries too
                     if f not in LIVE_FIELDS and f not in GENERATION_FIELDS and f not in PROMPT_FIELDS)


# the variables that choose the GPUs a process sees (CUDA, ROCm/HIP, Vulkan)
VISIBLE_DEVICES_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES")

# settings written as sizes ("2GiB", "512MB") or bytes
BYTE_FIELDS = frozenset({"prompt_cache_ram"})

# changing these applies to a loaded model at once (no worker restart)
LIVE_FIELDS = frozenset({"ttl_s", "pinned", "load_on_startup", "drain_timeout_s"})

# what a load fixes that only the router reads: in load_key, not worker_key (a change restarts no worker)
ROUTER_LOAD_FIELDS = frozenset({"own_instances"})

# the plain (Nitro-style) prompt's parts: a request carries them (wire.PromptFormat) for a variant
PROMPT_FIELDS = frozenset({"pre_prompt", "user_prompt", "ai_prompt", "system_prompt"})

# what the router adds to a request (corral.control.generation_defaults): a model's
# generation defaults, no worker restart when they change, and what a variant may differ in
GENERATION_FIELDS = frozenset({*SAMPLING_KEYS, "seed", "default_max_tokens", "system", "chat_template_kwargs",
                               "messages"})


def setting_names() -> tuple[str, ...]:
    return ModelSettings.__struct_fields__


class SettingsError(ValueError):
    """Bad model settings: ``errors`` is ``[(key, message), ...]``."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{k}: {m}" for k, m in errors))


def _choices(key: str) -> str:
    """The values a setting with ``Literal`` choices takes, for an error message."""
    found: list[str] = []
    numbers = False

    def walk(t: Any) -> None:
        nonlocal numbers
        if get_origin(t) is Literal:
            found.extend(str(a) for a in get_args(t))
        elif t in (int, float):
            numbers = True
        else:
            for a in get_args(t):
                walk(a)

    walk(get_type_hints(ModelSettings, include_extras=True).get(key))
    return ", ".join(found) + (", or a number" if numbers else "")


def _strip_path(text: str) -> str:
    """msgspec's ``Expected `int` >= 1 - at `$.n_parallel``` without the path."""
    head, sep, _ = text.rpartition(" - at `$")
    return head if sep else text
