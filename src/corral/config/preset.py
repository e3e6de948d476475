"""llama.cpp's model presets (``llama-server --models-preset FILE.ini``), read unchanged.

    version = 1              ; optional, before any section
    [*]                      ; every preset's defaults
    c = 8192
    [qwen3-8b]               ; one model: its id
    model = /models/Qwen3-8B-Q4_K_M.gguf
    temp = 0.6
    LLAMA_ARG_CACHE_TYPE_K = q8_0

A key is one of llama-server's options, written as its long name without dashes
(``n-gpu-layers``), any short form (``ngl``) or its environment variable
(``LLAMA_ARG_N_GPU_LAYERS``), plus the preset-only keys ``load-on-startup`` and
``stop-timeout``. Each is honoured as a corral model setting (``OPTIONS``); an option
that only tunes llama.cpp's own server (its HTTP threads, web UI, mmap...) is ignored
with a warning that names it; any other key is an error naming the file, the section
and the key: nothing is dropped silently. Precedence as llama-server's: the command
line, then the section, then ``[*]`` (corral's ``[defaults]`` below them all).

``read_preset`` returns each section as a model table (``PresetModel``); corral.config.file
puts them beside the TOML file's ``[models]`` (``[server] models_preset``, ``corral serve
--models-preset``) and re-reads the file on every reload. Relative paths resolve against
the server's working directory, as llama-server's do. A section must name its file (``model``) or a Hub repo
(``hf-repo``); a file over ``MAX_PRESET_BYTES`` is refused before it is parsed.
"""

from __future__ import annotations

import configparser
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.errors import ConfigError
from corral.model.ids import id_problem
from corral.model.settings import ModelSettings, SettingsError

__all__ = ["PresetModel", "Preset", "read_preset", "parse_preset", "select_section", "MAX_PRESET_BYTES",
           "OPTIONS", "IGNORED", "option_for", "option_entries", "GLOBAL"]

log = logging.getLogger("corral.config")

MAX_PRESET_BYTES = 1024 * 1024  # llama.cpp's own presets are a few KiB
GLOBAL = "*"


@dataclass
class PresetModel:
    """One section: the model's id, its file or Hub source, aliases and settings."""

    id: str
    path: Path | None = None
    hf_repo: str | None = None  # owner/repo[:TAG] (llama-server's -hf)
    hf_file: str | None = None
    aliases: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def source(self) -> str | None:
        """The pull source of an ``hf-repo`` section (corral.store.sources' forms)."""
        if self.hf_repo is None:
            return None
        if self.hf_file:
            return f"{self.hf_repo.split(':')[0]}/{self.hf_file}"
        return self.hf_repo


@dataclass
class Preset:
    name: str  # the file, for messages
    models: list[PresetModel]
    warnings: list[str]


class _Bad(ValueError):
    """A value a known option cannot take; the message says what it takes."""


# --------------------------------------------------------------------------- values


def _bool(v: str) -> bool:
    t = v.strip().lower()
    if t in ("1", "true", "on", "enabled", "yes"):
        return True
    if t in ("0", "false", "off", "disabled", "no"):
        return False
    raise _Bad(f"expected true or false, got {v!r}")


def _int(v: str) -> int:
    try:
        return int(v.strip())
    except ValueError:
        raise _Bad(f"expected an integer, got {v!r}") from None


def _float(v: str) -> float:
    try:
        return float(v.strip())
    except ValueError:
        raise _Bad(f"expected a number, got {v!r}") from None


def _list(v: str) -> list[str]:
    return [p.strip() for p in v.split(",") if p.strip()]


# A handler turns a value into model-table entries: ("settings key", value); the keys
# "path", "hf_repo", "hf_file", "aliases" are the section's own.
Handler = Callable[[str, "_Ctx"], list[tuple[str, Any]]]


@dataclass
class _Ctx:
    base: Path  # relative paths resolve against it

    def path(self, v: str) -> str:
        p = Path(v.strip()).expanduser()
        return str(p if p.is_absolute() else self.base / p)


def _set(key: str, conv: Callable[[str], Any]) -> Handler:
    return lambda v, ctx: [(key, conv(v))]


def _flag(key: str, value: Any = True) -> Handler:
    """A flag (``swa-full``): ``true`` sets ``value``; ``false`` leaves the default."""
    return lambda v, ctx: [(key, value)] if _bool(v) else []


def _ngl(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    t = v.strip().lower()
    if t == "auto":
        return [("n_gpu_layers", "auto")]
    if t == "all":
        return [("n_gpu_layers", -1)]
    n = _int(v)
    return [("n_gpu_layers", -1 if n > 100_000 else n)]  # llama-server's "99"/"999": all as well


def _flash(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    t = v.strip().lower()
    if t == "auto":
        return []
    return [("flash_attn", _bool(t))]


def _seed(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    n = _int(v)
    return [] if n < 0 else [("seed", n)]


def _predict(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    n = _int(v)
    return [] if n < 0 else [("default_max_tokens", n)]


def _parallel(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    n = _int(v)
    return [] if n < 0 else [("n_parallel", n)]  # -1: llama-server's auto; corral's default


def _ctx_size(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    return [("ctx_len", _int(v))]  # 0: from the model (corral: unset, capped at n_ctx_train)


def _mmproj(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    return [("mmproj", ctx.path(v))]


def _lora(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    return [("lora+", {"path": ctx.path(p), "scale": 1.0}) for p in _list(v)]


def _lora_scaled(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    """``FILE:SCALE[,FILE:SCALE...]`` (llama-server's INI form of ``--lora-scaled``)."""
    out: list[tuple[str, Any]] = []
    for part in _list(v):
        file, sep, scale = part.rpartition(":")
        if not sep:
            file, _, scale = part.rpartition(" ")
        if not file:
            raise _Bad(f"expected FILE:SCALE, got {part!r}")
        out.append(("lora+", {"path": ctx.path(file), "scale": _float(scale)}))
    return out


def _draft(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    return [("draft_model", ctx.path(v)), ("speculative", "draft")]


def _chat_template(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    text = v.strip()
    if "{%" in text or "{{" in text:
        return [("chat_template", text)]
    if text in BUILTIN_TEMPLATES:
        return [("chat_template", BUILTIN_TEMPLATES[text])]
    raise _Bad(f"{text!r} is no Jinja template and no built-in template corral knows "
               f"({', '.join(sorted(BUILTIN_TEMPLATES))}); give the template's text or chat-template-file")


def _chat_template_file(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    p = Path(ctx.path(v))
    try:
        if p.stat().st_size > MAX_PRESET_BYTES:
            raise _Bad(f"{p} is larger than {MAX_PRESET_BYTES} bytes")
        return [("chat_template", p.read_text(encoding="utf-8"))]
    except (OSError, UnicodeDecodeError) as exc:
        raise _Bad(f"cannot read {p}: {getattr(exc, 'strerror', None) or exc}") from None


def _json_object(key: str) -> Handler:
    def h(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
        try:
            obj = json.loads(v)
        except ValueError:
            raise _Bad(f"expected a JSON object, got {v!r}") from None
        if not isinstance(obj, dict):
            raise _Bad(f"expected a JSON object, got {v!r}")
        return [(key, obj)]
    return h


def _reasoning(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    t = v.strip().lower()
    if t == "auto":
        return []
    return [("reasoning_budget", -1 if _bool(t) else 0)]


def _reasoning_format(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    t = v.strip().lower()
    return [("reasoning_format", {"deepseek-legacy": "deepseek"}.get(t, t))]


def _breakers(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    t = v.strip()
    return [("dry_sequence_breakers", [] if t == "none" else [t])]


def _alias(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    return [("aliases", _list(v))]


def _cache_ram(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    n = _int(v)  # MiB; -1: no limit (corral: its default), 0: off
    return [] if n < 0 else [("prompt_cache_ram", n * 1024 * 1024)]


def _rerank(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    return [("embedding", True), ("pooling", "rank")] if _bool(v) else []


def _jinja(v: str, ctx: _Ctx) -> list[tuple[str, Any]]:
    if not _bool(v):
        raise _Bad("corral always renders chat templates with Jinja (jinja = false cannot be honoured)")
    return []


# A small table of llama.cpp's built-in template names corral can render (Jinja equivalents).
BUILTIN_TEMPLATES = {
    "chatml": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
}


@dataclass(frozen=True)
class Option:
    """One llama-server option: its names (long first), environment variable, and what it
    becomes here."""

    names: tuple[str, ...]
    env: str | None
    handler: Handler


def _o(names: str, env: str | None, handler: Handler) -> Option:
    return Option(tuple(names.split()), env, handler)


def _a(n: str) -> str:
    return "LLAMA_ARG_" + n


# llama-server's options corral honours, as model settings
OPTIONS: tuple[Option, ...] = (
    _o("model m", _a("MODEL"), lambda v, ctx: [("path", ctx.path(v))]),
    _o("hf-repo hf hfr", _a("HF_REPO"), lambda v, ctx: [("hf_repo", v.strip())]),
    _o("hf-file hff", _a("HF_FILE"), lambda v, ctx: [("hf_file", v.strip())]),
    _o("mmproj mm", _a("MMPROJ"), _mmproj),
    _o("no-mmproj", _a("NO_MMPROJ"), lambda v, ctx: [("mmproj", "")] if _bool(v) else []),
    _o("ctx-size c", _a("CTX_SIZE"), _ctx_size),
    _o("parallel np", _a("N_PARALLEL"), _parallel),
    _o("n-gpu-layers ngl gpu-layers", _a("N_GPU_LAYERS"), _ngl),
    _o("cache-type-k ctk", _a("CACHE_TYPE_K"), _set("cache_type_k", str.strip)),
    _o("cache-type-v ctv", _a("CACHE_TYPE_V"), _set("cache_type_v", str.strip)),
    _o("flash-attn fa", _a("FLASH_ATTN"), _flash),
    _o("swa-full", _a("SWA_FULL"), _flag("swa_full")),
    _o("batch-size b", _a("BATCH"), _set("n_batch", _int)),
    _o("threads t", _a("THREADS"), lambda v, ctx: [] if _int(v) < 0 else [("threads", _int(v))]),
    _o("threads-batch tb", _a("THREADS_BATCH"), lambda v, ctx: [] if _int(v) < 0 else [("threads_batch", _int(v))]),
    _o("tensor-split ts", _a("TENSOR_SPLIT"), lambda v, ctx: [("tensor_split", [_float(x) for x in _list(v)])]),
    _o("lora", None, _lora),
    _o("lora-scaled", None, _lora_scaled),
    _o("model-draft md", _a("MODEL_DRAFT"), _draft),
    _o("gpu-layers-draft ngld n-gpu-layers-draft", _a("N_GPU_LAYERS_DRAFT"),
       lambda v, ctx: [("draft_n_gpu_layers", -1 if v.strip().lower() in ("all", "auto") else _int(v))]),
    _o("draft-max draft draft-n spec-draft-n-max", _a("DRAFT_MAX"), _set("draft_max", _int)),
    _o("draft-min draft-n-min spec-draft-n-min", _a("DRAFT_MIN"), _set("draft_min", _int)),
    _o("draft-p-min spec-draft-p-min", _a("DRAFT_P_MIN"), _set("draft_p_min", _float)),
    _o("spec-default", None, _flag("speculative", "ngram")),
    _o("temp temperature", None, _set("temperature", _float)),
    _o("top-k", None, _set("top_k", _int)),
    _o("top-p", None, _set("top_p", _float)),
    _o("min-p", None, _set("min_p", _float)),
    _o("typical typical-p", None, _set("typical_p", _float)),
    _o("repeat-penalty", None, _set("repeat_penalty", _float)),
    _o("repeat-last-n", None, _set("repeat_last_n", _int)),
    _o("presence-penalty", None, _set("presence_penalty", _float)),
    _o("frequency-penalty", None, _set("frequency_penalty", _float)),
    _o("dry-multiplier", None, _set("dry_multiplier", _float)),
    _o("dry-base", None, _set("dry_base", _float)),
    _o("dry-allowed-length", None, _set("dry_allowed_length", _int)),
    _o("dry-penalty-last-n", None, _set("dry_penalty_last_n", _int)),
    _o("dry-sequence-breaker", None, _breakers),
    _o("seed s", None, _seed),
    _o("n-predict predict n", _a("N_PREDICT"), _predict),
    _o("chat-template", _a("CHAT_TEMPLATE"), _chat_template),
    _o("chat-template-file", _a("CHAT_TEMPLATE_FILE"), _chat_template_file),
    _o("chat-template-kwargs", _a("CHAT_TEMPLATE_KWARGS"), _json_object("chat_template_kwargs")),
    _o("jinja", _a("JINJA"), _jinja),
    _o("reasoning-format", _a("THINK"), _reasoning_format),
    _o("reasoning-budget", _a("THINK_BUDGET"), _set("reasoning_budget", _int)),
    _o("reasoning rea", _a("REASONING"), _reasoning),
    _o("alias a", _a("ALIAS"), _alias),
    _o("embedding embeddings", _a("EMBEDDINGS"), _flag("embedding")),
    _o("pooling", _a("POOLING"), _set("pooling", str.strip)),
    _o("rerank reranking", _a("RERANKING"), _rerank),
    _o("cache-ram cram", _a("CACHE_RAM"), _cache_ram),
    _o("verbose v log-verbose", None, _flag("verbose")),
    # the preset's own keys
    _o("load-on-startup", None, _set("load_on_startup", _bool)),
    _o("stop-timeout", None, _set("drain_timeout_s", _float)),
)

# llama-server options that tune only its own server or llama.cpp's internals, where
# corral has its own way (its [server] table, its scheduler) or none is needed: ignored,
# with a warning naming each
IGNORED: dict[str, str] = {name: why for names, why in (
    ("host port api-key api-key-file ssl-key-file ssl-cert-file timeout to threads-http path api-prefix "
     "webui no-webui webui-config webui-config-file metrics slots no-slots props slot-save-path media-path "
     "models-dir models-preset models-max models-autoload no-models-autoload sleep-idle-seconds "
     "log-disable log-file log-colors log-prefix log-timestamps log-verbosity lv verbosity offline "
     "dedup-cache-models tools agent cors-origins", "corral's [server] table and command line set these"),
    ("mmap no-mmap mlock direct-io dio numa prio prio-batch poll poll-batch cpu-mask cpu-range cpu-strict "
     "warmup no-warmup repack no-repack no-op-offload op-offload check-tensors perf no-perf "
     "escape no-escape cache-prompt no-cache-prompt", "llama.cpp's loading and threading details"),
    ("ubatch-size ub cont-batching cb no-cont-batching nocb kv-unified kvu no-kv-unified cache-reuse "
     "ctx-checkpoints swa-checkpoints checkpoint-min-step context-shift no-context-shift defrag-thold dt "
     "fit fit-target fitt fit-ctx fitc slot-prompt-similarity sps cache-idle-slots no-cache-idle-slots "
     "image-min-tokens image-max-tokens keep kv-offload no-kv-offload nkvo",
     "corral's scheduler, fit and prompt cache decide these"),
) for name in names.split()}
_IGNORED_ENV = {"LLAMA_ARG_" + n.upper().replace("-", "_"): n for n in IGNORED}
_IGNORED_ENV.update({"LLAMA_ARG_N_PARALLEL_AUTO": "parallel", "LLAMA_ARG_ENDPOINT_METRICS": "metrics",
                     "LLAMA_ARG_UBATCH": "ubatch-size", "LLAMA_ARG_CONT_BATCHING": "cont-batching",
                     "LLAMA_ARG_KV_SPLIT": "kv-unified", "LLAMA_ARG_NO_MMAP": "no-mmap",
                     "LLAMA_ARG_MLOCK": "mlock", "LLAMA_ARG_PORT": "port", "LLAMA_ARG_HOST": "host",
                     "LLAMA_ARG_API_KEY": "api-key", "LLAMA_ARG_DEFRAG_THOLD": "defrag-thold",
                     "LLAMA_ARG_NO_KV_OFFLOAD": "no-kv-offload"})

_BY_NAME: dict[str, Option] = {}
for _opt in OPTIONS:
    for _n in _opt.names:
        _BY_NAME[_n] = _opt
    if _opt.env:
        _BY_NAME[_opt.env] = _opt


def option_for(key: str) -> Option | str | None:
    """The option a preset key names: an ``Option``, the name of an ignored option (a
    str), or None for a key llama-server does not have (or corral cannot honour)."""
    k = key.strip()
    if k.startswith("-"):
        k = k.lstrip("-")
    if k in _BY_NAME:
        return _BY_NAME[k]
    if k in IGNORED:
        return k
    if k in _IGNORED_ENV:
        return _IGNORED_ENV[k]
    if not k.startswith("LLAMA_ARG_") and k.lower() in _BY_NAME:  # keys are case-insensitive but env names
        return _BY_NAME[k.lower()]
    return None


def option_entries(key: str, value: str, base: Path) -> tuple[list[tuple[str, Any]], str | None]:
    """One llama-server option as model-table entries (``path``, ``hf_repo``, ``hf_file``,
    ``aliases``, ``lora+`` or a setting), or why it is not carried over (corral config import)."""
    opt = option_for(key)
    if opt is None:
        return [], "not a llama-server option corral can honour"
    if isinstance(opt, str):
        return [], f"ignored: {IGNORED.get(opt, 'it tunes only llama-server itself')}"
    try:
        return opt.handler(value, _Ctx(base)), None
    except _Bad as exc:
        return [], str(exc)


# --------------------------------------------------------------------------- reading


def read_preset(path: Path) -> Preset:
    """Read and check a preset file (``ConfigError`` naming file, section and key)."""
    name = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_PRESET_BYTES:
            raise ConfigError(f"{name}: the preset file is {size} bytes; a preset is at most "
                              f"{MAX_PRESET_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{name}: preset file not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: not valid UTF-8 (an INI preset is text)") from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the preset file: {exc.strerror}") from None
    return parse_preset(text, name=name, base=Path.cwd())


def parse_preset(text: str, *, name: str, base: Path, only: str | None = None) -> Preset:
    """The models of a preset's text (``only``: that section alone, llama-server's
    ``-hf user/repo:NAME``)."""
    if len(text.encode("utf-8")) > MAX_PRESET_BYTES:
        raise ConfigError(f"{name}: the preset is larger than {MAX_PRESET_BYTES} bytes")
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\x00defaults",
                                       comment_prefixes=(";", "#"), inline_comment_prefixes=None,
                                       delimiters=("=",), empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # LLAMA_ARG_* keep their case
    top = "\x00top"
    try:
        parser.read_string(f"[{top}]\n" + text, source=name)
    except configparser.Error as exc:
        raise ConfigError(f"{name}: not a valid INI preset: {_ini_error(exc)}") from None
    errors: list[str] = []
    warnings: list[str] = []
    for key, value in parser.items(top):
        if key == "version":
            if value.strip() != "1":
                errors.append(f"{name}: key 'version' at top level: corral reads version 1 presets, not {value!r}")
        else:
            errors.append(f"{name}: key {key!r} at top level: put it in a section ([*] for every model)")
    ctx = _Ctx(base)
    common = _section(parser, GLOBAL, name, ctx, errors, warnings) if parser.has_section(GLOBAL) else None
    models: list[PresetModel] = []
    sections = [s for s in parser.sections() if s not in (top, GLOBAL)]
    if only is not None:
        if only not in sections:
            raise ConfigError(f"{name}: no preset [{only}] (it has {', '.join(sections) or 'none'})")
        sections = [only]
    for sec in sections:
        m = _section(parser, sec, name, ctx, errors, warnings)
        if m is None:
            continue
        if common is not None:
            m = _layer(common, m)
        problem = id_problem(sec)
        if problem is not None:
            errors.append(f"{name}: [{sec}]: the section name is the model's id, and it is not a valid one: {problem}")
        elif m.path is None and m.hf_repo is None:
            errors.append(f"{name}: [{sec}]: no model: give model = FILE.gguf or hf-repo = owner/repo[:TAG]")
        models.append(m)
    if errors:
        raise ConfigError("; ".join(errors))
    for w in warnings:
        log.warning("%s", w)
    return Preset(name, models, warnings)


def select_section(text: str, section: str) -> str:
    """The preset's text with only its top level, ``[*]`` and ``[section]`` (comments kept)."""
    keep, out = True, []
    for line in text.splitlines(keepends=True):
        head = line.strip()
        if head.startswith("[") and head.endswith("]"):
            keep = head[1:-1].strip() in (GLOBAL, section)
        if keep:
            out.append(line)
    return "".join(out)


def _ini_error(exc: configparser.Error) -> str:
    text = str(exc).replace("\x00top", "top level")
    return text.splitlines()[0] if text else type(exc).__name__


def _layer(common: PresetModel, m: PresetModel) -> PresetModel:
    """``[*]`` under a section (the section wins key by key; LoRA lists are the section's
    when it has one)."""
    return PresetModel(id=m.id, path=m.path or common.path, hf_repo=m.hf_repo or common.hf_repo,
                       hf_file=m.hf_file or common.hf_file, aliases=m.aliases or common.aliases,
                       settings={**common.settings, **m.settings})


def _section(parser: configparser.ConfigParser, sec: str, name: str, ctx: _Ctx,
             errors: list[str], warnings: list[str]) -> PresetModel | None:
    m = PresetModel(id=sec)
    given: dict[str, str] = {}  # settings key -> the preset key that set it
    loras: list[dict[str, Any]] = []
    bad = len(errors)
    for key, value in parser.items(sec):
        where = f"{name}: [{sec}] key {key!r}"
        opt = option_for(key)
        if opt is None:
            errors.append(f"{where}: not a llama-server option corral can honour (check the spelling; "
                          "docs/guide/presets.md lists the keys)")
            continue
        if isinstance(opt, str):
            warnings.append(f"{where}: ignored: {IGNORED.get(opt, 'it tunes only llama-server itself')}")
            continue
        try:
            entries = opt.handler(value, ctx)
        except _Bad as exc:
            errors.append(f"{where}: {exc}")
            continue
        for k, v in entries:
            if k == "path":
                m.path = Path(v)
            elif k == "hf_repo":
                m.hf_repo = v
            elif k == "hf_file":
                m.hf_file = v
            elif k == "aliases":
                m.aliases = list(v)
            elif k == "lora+":
                loras.append(v)
            else:
                m.settings[k] = v
                given[k] = key
    if loras:
        m.settings["lora"] = [{"id": f"lora{i}", **a} for i, a in enumerate(loras)]
        given["lora"] = "lora"
    try:
        m.settings = ModelSettings.check_partial(m.settings)
    except SettingsError as exc:
        errors += [f"{name}: [{sec}] key {given.get(k, k)!r}: {msg}" for k, msg in exc.errors]
    return m if len(errors) == bad else None
