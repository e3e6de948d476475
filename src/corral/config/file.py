"""corral's configuration: one TOML file, validated by pydantic, in fixed phases.

    [server]            the router process: address, budget, queue, timeouts, api_key
    [defaults]          model settings every model inherits
    [models."ID"]       one table per model (quote ids that contain dots)

Loading runs in phases: parse TOML -> validate against the schema (``extra="forbid"``,
so a misspelt key is an error) -> apply command-line overrides -> normalize paths
(relative to the config file). Precedence for model settings: command line > model
table > ``[defaults]`` > built-in defaults. Every error is a ``ConfigError`` whose
message names the file, the table and the key.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, get_args

import msgspec
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, IPvAnyNetwork, PrivateAttr,
                      ValidationError, ValidationInfo, field_validator)

from corral.config.errors import pydantic_errors, settings_errors, location
from corral.config.preset import read_preset
from corral.errors import ConfigError
from corral.model.ids import id_problem
from corral.units import parse_bytes
from corral.model.settings import ModelSettings, SettingsError, setting_names

__all__ = [
    "ServerConfig",
    "ModelConfig",
    "CorralConfig",
    "load_config",
    "config_from_dict",
    "default_config",
    "add_pulled_model",
]

ByteSize = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]

_STRICT = ConfigDict(extra="forbid", validate_assignment=True)


def _takes_bool(annotation: Any) -> bool:
    return annotation is bool or any(_takes_bool(a) for a in get_args(annotation))


class _NoBoolNumbers(BaseModel):
    """TOML ``true`` is not a number: ``max_queue = true`` is an error, not 1."""

    @field_validator("*", mode="before")
    @classmethod
    def _bool_is_not_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _takes_bool(field.annotation):
                raise ValueError(f"expected {_kind(field.annotation)}, got {str(value).lower()}")
        return value


def _kind(annotation: Any) -> str:
    names = {int: "an integer", float: "a number", str: "a string", Path: "a path"}
    for a in (annotation, *get_args(annotation)):
        for inner in (a, *get_args(a)):
            if inner in names:
                return names[inner]
    return "a value of another type"


class ServerConfig(_NoBoolNumbers):
    model_config = _STRICT

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_loaded_models: int = Field(4, ge=1)  # 1 = single-GPU mode: one model at a time
    memory_budget: ByteSize | None = None  # sum of what loaded workers report
    # GPUs (control/placement/gpus.py): each GPU's budget is its free memory at startup less this margin,
    # capped per GPU (by index) by gpu_memory_budget when given
    gpu_memory_margin: ByteSize = 512 * 1024 * 1024
    gpu_memory_budget: list[ByteSize] = []
    models_dir: Path | None = None  # None: corral.store.local.default_models_dir()
    # a llama.cpp preset file (llama-server's --models-preset; corral.config.preset): each section
    # one more model, re-read on reload
    models_preset: Path | None = None
    include_default_model: bool = True  # serve the embedded gemma-3-270m (alias "default")
    # list the models of llama.cpp's cache ($LLAMA_CACHE, else ~/.cache/llama.cpp: what
    # llama-server -hf pulled) beside models_dir's, served in place (corral.store.llama_cache)
    llama_cache: bool = True
    max_queue: int = Field(64, ge=0)  # per model, requests waiting for a slot
    autoload: bool = True  # False: requests for unloaded models get 400 model_not_loaded
    api_key: str | None = None  # one admin key (usage counts it as key "api_key")
    # the keys file (corral.config.keys_file; `corral keys add`): keys with scopes, models and limits,
    # re-read when it changes or on SIGHUP. Set, every route but /health and the page needs a key.
    keys_file: Path | None = None
    # where the router keeps state (usage.db); None: $CORRAL_STATE_DIR, else
    # $XDG_STATE_HOME/corral, else ~/.local/state/corral
    state_dir: Path | None = None
    # the prompt cache on disk (docs/internals/prompt-cache.md), in state_dir's prompt-cache/:
    # at most this many bytes for all models (least recently used files go first; 0: off);
    # an instance that unloads writes up to prompt_cache_write bytes of its most valuable
    # prefixes, for at most prompt_cache_write_s (a swap never waits longer)
    prompt_cache_disk: ByteSize = 8 * 1024**3
    prompt_cache_write: ByteSize = 1024**3
    prompt_cache_write_s: float = Field(3.0, ge=0)
    # directories outside models_dir whose models requests may name (Nitro llama_model_path)
    allowed_model_dirs: list[Path] = []
    # the page's Hub search, listings and header reads (api/page/hub.py): each gives up after this
    hub_timeout_s: float = Field(20.0, gt=0, le=600)
    # streams that outlive their client (X-Conversation-Id, GET/DELETE /v1/stream:
    # corral.control.conversations): per key, how many are kept, how many bytes of events
    # they may hold together, and how long a finished one stays readable
    max_conversations_per_key: int = Field(16, ge=1)
    conversation_bytes_per_key: ByteSize = 8 * 1024**2
    conversation_ttl_s: float = Field(300.0, gt=0)
    # web origins (e.g. "http://localhost:3000", "https://*.example.com") that browsers may
    # call the API from (CORS); same-origin pages always may. Like Ollama's OLLAMA_ORIGINS.
    allowed_origins: list[str] = []
    # host names the server answers to besides IP literals, localhost, the bound host and
    # this machine's name (DNS rebinding protection); "*" accepts any
    allowed_hosts: list[str] = []
    header_timeout_s: float = Field(10.0, gt=0)  # a request's headers must arrive within this
    load_timeout_s: float = Field(300.0, gt=0)
    queue_timeout_s: float = Field(60.0, gt=0)  # a load's wait for room; a key's for its concurrency
    # a request's wait for a slot; absent: as long as its client waits (like llama-server, vLLM,
    # Ollama); shedding is max_queue's immediate 503 + Retry-After (docs/internals/fair-share.md)
    request_queue_timeout_s: float | None = Field(None, gt=0)
    # past the router's own saturation: while its loop lags more than this (smoothed), new
    # requests to a model get 503 + Retry-After before their body is read (api/overload.py); 0: never
    shed_lag_s: float = Field(0.25, ge=0)
    # the fair queue (control/scheduling/fair_queue.py): waiting this long raises a request's priority by one
    priority_aging_s: float = Field(10.0, gt=0)
    # at max_loaded_models, a loaded model keeps its place this long after loading (an idle one
    # is not evicted, a busy one is unloaded after it, drained, when another waits); 0: off
    model_time_slice_s: float = Field(0.0, ge=0)
    # fair-share preemption (control/scheduling/preempt.py): while other keys wait, a key over its share of
    # a model's slots has a sequence paused (its KV kept in the worker's RAM) for a waiting key
    preempt: bool = True
    preempt_min_run_s: float = Field(1.0, ge=0)  # a resumed sequence runs this long before another pause
    drain_timeout_s: float = Field(30.0, ge=0)  # unload/reload lets running requests finish
    stop_grace_s: float = Field(5.0, ge=0)  # Shutdown -> SIGTERM after this
    shutdown_timeout_s: float = Field(10.0, ge=0)  # SIGINT/SIGTERM: running requests finish, then 503 (api/shutdown.py)
    max_restarts: int = Field(3, ge=0)  # consecutive failures before an instance stays failed
    restart_backoff_s: float = Field(1.0, ge=0)  # doubles per consecutive failure, max 30 s
    max_body_bytes: ByteSize = 8 * 1024 * 1024
    # one file uploaded for Ollama's create (POST /api/blobs/:digest: a GGUF or an adapter)
    max_upload_bytes: ByteSize = 256 * 1024**3
    allow_image_urls: bool = False  # images in requests: api/core/image_fetch.py, docs/internals/media.md
    allow_private_image_urls: bool | list[IPvAnyNetwork] = False  # true (any), or CIDR networks
    image_url_timeout_s: float = Field(10.0, gt=0)
    # pull URLs from loopback, link-local or private addresses: true (any), or CIDR networks
    # (the same policy as image URLs: store/address_policy.py)
    allow_private_pull_urls: bool | list[IPvAnyNetwork] = False
    max_image_bytes: ByteSize = 20 * 1024 * 1024  # one image, encoded
    max_image_pixels: int = Field(50_000_000, ge=1)  # width x height, checked before decoding
    max_images_per_request: int = Field(32, ge=1)
    max_image_bytes_per_request: ByteSize = 50 * 1024 * 1024  # encoded: inline and fetched
    max_image_pixels_per_request: int = Field(100_000_000, ge=1)  # all of a request's, from headers
    # audio in requests (api/core/audio.py, docs/internals/audio.md): each file is decoded in a
    # child process bounded in time and memory; a recording longer than max_audio_s is refused
    # while it is decoded (a small file that decodes to hours never is in full)
    max_audio_bytes: ByteSize = 25 * 1024 * 1024  # one file, encoded (OpenAI's limit)
    max_audio_bytes_per_request: ByteSize = 50 * 1024 * 1024  # a request's files together, encoded
    max_audio_files_per_request: int = Field(16, ge=1)
    max_audio_s: float = Field(3600.0, gt=0)  # a request's recordings together, decoded
    audio_decode_timeout_s: float = Field(60.0, gt=0)  # one file's decode, wall clock
    audio_decode_memory: ByteSize = 1024 * 1024 * 1024  # the decoding child's address space
    log_dir: Path | None = None  # worker stderr logs; None: a temporary directory
    worker_command: list[str] | None = None  # advanced/tests: argv prefix instead of python -m corral.worker
    # Ray cluster for model instances ("auto", "HOST:PORT", "ray://HOST:10001"); None: local processes
    ray_address: str | None = None
    ray_namespace: str = "corral"


class ModelConfig(BaseModel):
    """A ``[models.ID]`` table: the file, its aliases, and model settings
    (``corral.model.settings.ModelSettings`` keys, validated there; ``settings`` holds the
    ones this table sets)."""

    model_config = _STRICT

    path: Path | None = None  # None: the file of ``pull``, once pulled into the store
    aliases: list[str] = []
    # a Hub source (a preset's hf-repo: owner/repo[:TAG]) pulled through the store, under this
    # model's id, when a request first needs it
    pull: str | None = None
    _settings: dict[str, Any] = PrivateAttr(default_factory=dict)
    _origin: str | None = PrivateAttr(default=None)

    @property
    def settings(self) -> dict[str, Any]:
        return self._settings

    @property
    def origin(self) -> str | None:
        """The preset file this model came from (None: the TOML file)."""
        return self._origin

    @origin.setter
    def origin(self, value: str | None) -> None:
        self._origin = value


class CorralConfig(BaseModel):
    model_config = _STRICT

    server: ServerConfig = ServerConfig()
    models: dict[str, ModelConfig] = {}
    # not validated by pydantic: the [defaults] table (ModelSettings keys it sets), where
    # the file came from and the command-line overrides of model settings
    defaults: dict[str, Any] = Field(default_factory=dict, exclude=True)
    source: Path | None = Field(None, exclude=True)
    cli_model_overrides: dict[str, Any] = Field(default_factory=dict, exclude=True)

    def model_settings(self, model_id: str) -> ModelSettings:
        """Effective settings of a configured model: CLI > model table > defaults > builtin."""
        return ModelSettings.layered([self.defaults, self.models[model_id].settings,
                                      self.cli_model_overrides])

    def inherited_settings(self) -> ModelSettings:
        """Settings for a model not in the file (models_dir, pulled, Nitro loadmodel)."""
        return ModelSettings.layered([self.defaults, self.cli_model_overrides])


# --------------------------------------------------------------------------- loading


def _split_settings(data: dict[str, Any], name: str, errors: list[str]
                    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Take the model settings out of [defaults] and each [models.ID] table (they are
    validated by ``ModelSettings``); what is left goes to pydantic."""
    defaults: dict[str, Any] = {}
    table = data.pop("defaults", {})
    if not isinstance(table, dict):
        errors.append(f"{name}: key 'defaults' at top level: must be a table")
    else:
        try:
            defaults = ModelSettings.check_partial(table)
        except SettingsError as exc:
            errors += settings_errors(name, ("defaults",), exc)
    per_model: dict[str, dict[str, Any]] = {}
    models = data.get("models")
    if isinstance(models, dict):
        names = set(setting_names())
        rest_models: dict[str, Any] = {}
        for mid, tbl in models.items():
            if not isinstance(tbl, dict):
                rest_models[mid] = tbl
                continue
            given = {k: v for k, v in tbl.items() if k in names}
            rest_models[mid] = {k: v for k, v in tbl.items() if k not in names}
            try:
                per_model[mid] = ModelSettings.check_partial(given)
            except SettingsError as exc:
                errors += settings_errors(name, ("models", str(mid)), exc)
        data["models"] = rest_models
    return defaults, per_model


def _check_names(cfg: CorralConfig, name: str) -> None:
    seen: dict[str, str] = {}
    for mid, m in cfg.models.items():
        problem = id_problem(mid)
        if problem is not None:
            raise ConfigError(f"{name}: [models] table name {mid!r} is not a valid model id: {problem}")
        seen.setdefault(mid, mid)
    for mid, m in cfg.models.items():
        for alias in m.aliases:
            other = seen.get(alias)
            if other is not None and other != mid:
                raise ConfigError(
                    f"{name}: {location(('models', mid, 'aliases'))}: alias {alias!r} "
                    f"is already the id or an alias of model {other!r}")
            seen[alias] = mid


def config_from_dict(data: dict[str, Any], *, name: str = "<config>",
                     base_dir: Path | None = None) -> CorralConfig:
    """Validate a parsed TOML document. Relative paths resolve against ``base_dir``."""
    data = dict(data)
    errors: list[str] = []
    defaults, per_model = _split_settings(data, name, errors)
    for mid, tbl in (data.get("models") or {}).items() if isinstance(data.get("models"), dict) else ():
        if isinstance(tbl, dict) and tbl.get("path") is None and tbl.get("pull") is None:
            errors.append(f"{name}: {location(('models', str(mid), 'path'))}: required key is missing "
                          "(the model's file; or pull = \"owner/repo:TAG\")")
    cfg: CorralConfig | None = None
    try:
        cfg = CorralConfig.model_validate(data)
    except ValidationError as exc:
        errors = pydantic_errors(name, exc) + errors
    if errors or cfg is None:
        raise ConfigError("; ".join(errors))
    cfg.defaults = defaults
    for mid, m in cfg.models.items():
        m.settings.update(per_model.get(mid, {}))
    _check_names(cfg, name)
    _check_across(cfg, name)
    base = base_dir or Path.cwd()
    for mid, m in cfg.models.items():
        if m.path is None:
            if m.pull is None:
                raise ConfigError(f"{name}: {location(('models', mid, 'path'))}: required key is missing "
                                  "(the model's file; or pull = \"owner/repo:TAG\")")
            continue
        p = m.path.expanduser()
        m.path = p if p.is_absolute() else (base / p)
        if m.settings.get("mmproj"):  # the projector file resolves like the model's ("": none)
            q = Path(m.settings["mmproj"]).expanduser()
            m.settings["mmproj"] = str(q if q.is_absolute() else base / q)
    for table in (cfg.defaults, *(m.settings for m in cfg.models.values())):
        if table.get("lora"):  # adapter files resolve like the model's path
            table["lora"] = [msgspec.structs.replace(a, path=str(_resolve(Path(a.path), base)))
                             for a in table["lora"]]
    for attr in ("models_dir", "log_dir", "keys_file", "state_dir", "models_preset"):
        p = getattr(cfg.server, attr)
        if p is not None:
            p = p.expanduser()
            setattr(cfg.server, attr, p if p.is_absolute() else base / p)
    cfg.server.allowed_model_dirs = [d.expanduser() if d.expanduser().is_absolute()
                                     else base / d.expanduser()
                                     for d in cfg.server.allowed_model_dirs]
    if cfg.server.models_preset is not None:
        _add_preset(cfg, cfg.server.models_preset, name)
    _check_model_files(cfg, name)
    return cfg


def _add_preset(cfg: CorralConfig, path: Path, name: str) -> None:
    """The preset's sections as models beside the file's (corral.config.preset): the
    preset's ``[*]`` and section settings above ``[defaults]``, the command line above all."""
    preset = read_preset(path)
    for m in preset.models:
        if m.id in cfg.models:
            raise ConfigError(f"{preset.name}: [{m.id}]: model {m.id!r} is in {name} too; "
                              "keep one of them")
        mc = ModelConfig(path=m.path, aliases=m.aliases, pull=m.source if m.path is None else None)
        mc.settings.update(m.settings)
        mc.origin = preset.name
        cfg.models[m.id] = mc
    errors: list[str] = []
    for m in preset.models:  # the rules between settings, as the section and [*] combine
        try:
            cfg.model_settings(m.id)
        except SettingsError as exc:
            errors += [f"{preset.name}: [{m.id}] key {key!r}: {msg}" for key, msg in exc.errors]
    try:
        if errors:
            raise ConfigError("; ".join(errors))
        _check_names(cfg, name)
    except ConfigError:
        for m in preset.models:
            cfg.models.pop(m.id, None)
        raise


def _resolve(p: Path, base: Path) -> Path:
    p = p.expanduser()
    return p if p.is_absolute() else base / p


def _check_across(cfg: CorralConfig, name: str, *, options: bool = False) -> None:
    """The rules between settings, for each model as its tables combine and for models
    not in the file (they inherit [defaults]; ``options``: the command line's options
    are what is checked, and named so)."""
    errors: list[str] = []
    for mid, table in [*((m, ("models", m)) for m in cfg.models), (None, ("defaults",))]:
        try:
            cfg.model_settings(mid) if mid is not None else cfg.inherited_settings()
        except SettingsError as exc:
            if mid is None and options:
                errors += [f"{name}: {key}: {msg}" for key, msg in exc.errors]
            else:
                errors += settings_errors(name, table, exc)
    if errors:
        raise ConfigError("; ".join(errors))


def _check_model_files(cfg: CorralConfig, name: str) -> None:
    """A model path that is a directory or not a GGUF file is an error now, naming the
    file, table and key (a missing file is not: it may be downloaded later). With a
    ``worker_command`` (another worker program) only directories are refused."""
    gguf_only = cfg.server.worker_command is None
    for mid, m in cfg.models.items():
        where = location(("models", mid, "path"))
        if m.path is None:
            continue
        if m.path.is_dir():
            raise ConfigError(f"{name}: {where}: {m.path} is a directory, not a GGUF model file")
        try:  # non-blocking: a FIFO named as a model must not hold the config's load
            fd = os.open(m.path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ConfigError(f"{name}: {where}: {m.path} is not a regular file")
                magic = os.pread(fd, 4, 0)
            finally:
                os.close(fd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"{name}: {where}: cannot read {m.path}: {exc.strerror}") from None
        if gguf_only and magic != b"GGUF":
            raise ConfigError(f"{name}: {where}: {m.path} is not a GGUF model file "
                              "(it does not start with the GGUF magic)")


def load_config(path: Path | None, *, server_overrides: dict[str, Any] | None = None,
                model_overrides: dict[str, Any] | None = None) -> CorralConfig:
    """Read, validate and normalize a config file (None: built-in defaults only).

    ``server_overrides`` / ``model_overrides`` come from the command line and win."""
    data: dict[str, Any] = {}
    name = "<command line>"
    base = None
    if path is not None:
        path = Path(path).expanduser()
        name = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{name}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{name}: cannot read config file: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[:exc.start].count(b"\n") + 1
            raise ConfigError(f"{name}: line {line}: not valid UTF-8 (byte {exc.object[exc.start]:#04x} "
                              f"at offset {exc.start}); TOML files must be UTF-8") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{name}: not valid TOML: {exc}") from None
        base = path.resolve().parent
    for table in ("server", "defaults", "models"):
        if table in data and not isinstance(data[table], dict):
            raise ConfigError(f"{name}: key '{table}' at top level: must be a table ([{table}]), "
                              f"not {type(data[table]).__name__}")
    if server_overrides:
        srv = dict(data.get("server", {}))
        srv.update({k: v for k, v in server_overrides.items() if v is not None})
        data["server"] = srv
    cfg = config_from_dict(data, name=name, base_dir=base)
    if model_overrides:
        try:
            cfg.cli_model_overrides = ModelSettings.check_partial(
                {k: v for k, v in model_overrides.items() if v is not None})
        except SettingsError as exc:
            raise ConfigError("; ".join(settings_errors("<command line>", (), exc))) from None
        _check_across(cfg, "<command line>", options=True)
    cfg.source = path.resolve() if path is not None else None
    return cfg


def add_pulled_model(cfg: CorralConfig, source: str) -> None:
    """A model named by its Hub source (``corral serve -hf user/repo:TAG`` of a repo without a
    preset), pulled under that name when a request first needs it."""
    model_id = source.strip()
    problem = id_problem(model_id)
    if problem is not None:
        raise ConfigError(f"-hf {source!r}: not a usable model name: {problem}")
    if model_id not in cfg.models:
        cfg.models[model_id] = ModelConfig(pull=model_id)
        _check_names(cfg, "<command line>")


def default_config() -> CorralConfig:
    return CorralConfig()
