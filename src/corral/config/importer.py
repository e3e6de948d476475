"""``corral config import FILE``: the corral TOML config another server's setup amounts to.

Three kinds of file, told apart by name and content:

- a llama.cpp preset (``*.ini``: corral.config.preset's keys): each section a
  ``[models."ID"]`` table, ``[*]`` written into each (it applies to the preset's models only);
- an Ollama Modelfile (``FROM`` ...: corral.config.modelfile): one table, named by ``name``;
- llama-swap's ``config.yaml``: each ``models`` entry whose ``cmd`` runs llama-server (its
  options read like a preset's keys, ``${macros}`` expanded), its ``aliases`` and ``ttl``.

What cannot be carried over is never dropped silently: it is written as a comment at the
place it would have gone (``# not carried over: KEY = VALUE: why``). The output is TOML that
``corral serve --config`` reads (tests check it loads).
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
from pathlib import Path
from typing import Any

import msgspec

from corral.config.modelfile import PARAMETERS, parse_modelfile
from corral.config.preset import GLOBAL, MAX_PRESET_BYTES, option_entries
from corral.errors import ConfigError
from corral.model.ids import id_problem

__all__ = ["import_config", "kind_of"]

_N_PARALLEL = 4  # corral's default slots: Ollama's num_ctx (one sequence's) times this


def kind_of(path: Path, text: str) -> str:
    name = path.name.lower()
    if name.endswith((".yaml", ".yml")):
        return "llama-swap"
    if name.endswith(".ini"):
        return "preset"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("#", ";"))), "")
    if first.upper().startswith("FROM "):
        return "modelfile"
    if first.startswith("["):
        return "preset"
    if re.match(r"^[A-Za-z_]+:", first):
        return "llama-swap"
    raise ConfigError(f"{path}: not a preset.ini, a Modelfile or a llama-swap config.yaml")


def import_config(path: Path, *, name: str | None = None) -> str:
    try:
        if path.stat().st_size > MAX_PRESET_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_PRESET_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    kind = kind_of(path, text)
    base = path.resolve().parent
    head = [f"# corral.toml from {path.name} ({kind}), written by `corral config import`", ""]
    if kind == "preset":
        body = _from_preset(text, str(path), base)
    elif kind == "modelfile":
        body = _from_modelfile(text, str(path), base, name or path.stem.lower().replace("modelfile", "") or "imported")
    else:
        body = _from_llama_swap(text, str(path), base)
    return "\n".join(head + body) + "\n"


# --------------------------------------------------------------------------- writing


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return _toml(msgspec.to_builtins(value))


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _table(mid: str) -> str:
    return f"[models.{_key(mid)}]"


def _not_carried(key: str, value: Any, why: str) -> str:
    shown = value if isinstance(value, str) else json.dumps(value)
    return f"# not carried over: {key} = {shown}: {why}".replace("\n", " ")


class _Model:
    """One table being written: its entries in order, and the comments between them."""

    def __init__(self, mid: str) -> None:
        self.id = mid
        self.lines: list[str] = []
        self.values: dict[str, Any] = {}
        self.loras: list[dict[str, Any]] = []

    def put(self, entries: list[tuple[str, Any]]) -> None:
        for k, v in entries:
            if k == "lora+":
                self.loras.append({"id": f"lora{len(self.loras)}", **v})
            elif k == "hf_repo":
                self.values["pull"] = v
            elif k == "hf_file":
                self.values["pull"] = f"{str(self.values.get('pull', '')).split(':')[0]}/{v}"
            else:
                self.values[k] = v

    def render(self) -> list[str]:
        out = [_table(self.id)]
        if self.loras:
            self.values["lora"] = self.loras
        if "path" not in self.values and "pull" not in self.values:
            out.append("# path = \"...\"  # no model file was given: set it (the table is not valid without it)")
        for k, v in self.values.items():
            out.append(f"{k} = {_toml(v)}")
        return out + self.lines + [""]


# --------------------------------------------------------------------------- the three kinds


def _from_preset(text: str, name: str, base: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None, strict=False, default_section="\x00defaults",
                                       comment_prefixes=(";", "#"), delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string("[\x00top]\n" + text, source=name)
    except configparser.Error as exc:
        raise ConfigError(f"{name}: not a valid INI preset: {str(exc).splitlines()[0]}") from None
    out: list[str] = []
    for key, value in parser.items("\x00top"):
        if key != "version":
            out.append(_not_carried(key, value, "a key outside any section"))
    common = list(parser.items(GLOBAL)) if parser.has_section(GLOBAL) else []
    for sec in parser.sections():
        if sec in ("\x00top", GLOBAL):
            continue
        m = _Model(sec)
        if id_problem(sec) is not None:
            out.append(f"# not carried over: [{sec}]: not a valid model id ({id_problem(sec)})")
            continue
        for key, value in [*common, *parser.items(sec)]:
            entries, why = option_entries(key, value, base)
            if why is not None:
                m.lines.append(_not_carried(key, value, why))
            m.put(entries)
        out += m.render()
    return out


def _from_modelfile(text: str, name: str, base: Path, model_id: str) -> list[str]:
    mf = parse_modelfile(text, name=name)
    if id_problem(model_id) is not None:
        raise ConfigError(f"{name}: {model_id!r} is not a valid model id; give one with --name")
    m = _Model(model_id)
    src = Path(mf.source).expanduser()
    src = src if src.is_absolute() else base / src
    if mf.source.lower().endswith(".gguf") or src.is_file():
        m.values["path"] = str(src)
    else:
        m.lines.append(_not_carried("FROM", mf.source, "a model name; corral's table names the model's file "
                                    "(or make it with `corral create NAME -f Modelfile` on a running server)"))
    for key, value in mf.parameters.items():
        target = PARAMETERS.get(key)
        if target is None:
            m.lines.append(_not_carried(f"PARAMETER {key}", value, "no corral setting"))
        elif key == "num_ctx" and isinstance(value, int):
            m.values["ctx_len"] = value * _N_PARALLEL
            m.lines.append(f"# num_ctx {value} is one sequence's context: ctx_len is {_N_PARALLEL} slots' "
                           f"(n_parallel = {_N_PARALLEL})")
        elif key == "num_predict" and isinstance(value, int) and value < 0:
            continue
        else:
            m.values[target] = value
    if mf.system is not None:
        m.values["system"] = mf.system
    if mf.template is not None:
        if "{%" not in mf.template and re.search(r"\{\{-?\s*\.", mf.template):
            m.lines.append(_not_carried("TEMPLATE", mf.template[:60] + "...", "an Ollama (Go) template; corral "
                                        "renders Jinja chat templates (the GGUF's own is used)"))
        else:
            m.values["chat_template"] = mf.template
    for a in mf.adapters:
        ap = Path(a).expanduser()
        m.loras.append({"id": f"adapter{len(m.loras)}", "path": str(ap if ap.is_absolute() else base / ap)})
    if mf.messages:
        m.values["messages"] = mf.messages
    for lic in mf.license:
        m.lines.append(_not_carried("LICENSE", lic[:60], "corral's config keeps no license "
                                    "(a model made with `corral create` shows it in /api/show)"))
    return m.render()


def _from_llama_swap(text: str, name: str, base: Path) -> list[str]:
    import yaml  # type: ignore[import-untyped]

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise ConfigError(f"{name}: no models: a llama-swap config.yaml has a models: mapping")
    macros = {str(k): str(v) for k, v in (doc.get("macros") or {}).items()}
    out: list[str] = []
    for key, value in doc.items():
        if key not in ("models", "groups", "macros"):
            out.append(_not_carried(str(key), value, "a llama-swap setting corral has no counterpart for "
                                    "(its [server] table: docs/guide/configuration.md)"))
    for mid, entry in doc["models"].items():
        mid = str(mid)
        if id_problem(mid) is not None or not isinstance(entry, dict):
            out.append(f"# not carried over: model {mid!r}: not a valid model id or entry")
            continue
        m = _Model(mid)
        cmd = str(entry.get("cmd", ""))
        for k, v in macros.items():
            cmd = cmd.replace("${" + k + "}", v)
        if not _cmd_options(m, cmd, base):  # not llama-server: the whole entry is a comment
            out += [f"# not carried over: model {mid!r}:", *m.lines, ""]
            continue
        if entry.get("aliases"):
            m.values["aliases"] = [str(a) for a in entry["aliases"]]
        if isinstance(entry.get("ttl"), (int, float)) and entry["ttl"] > 0:
            m.values["ttl_s"] = float(entry["ttl"])
        for k, v in entry.items():
            if k not in ("cmd", "aliases", "ttl"):
                m.lines.append(_not_carried(str(k), v, "llama-swap's own (corral runs and checks its workers itself)"))
        out += m.render()
    for gname, group in (doc.get("groups") or {}).items():
        members = ", ".join(str(x) for x in (group or {}).get("members", []))
        out.append(f"# not carried over: group {gname} ({members}): corral loads models by memory budget and "
                   "[server] max_loaded_models (1: one model at a time, as swap: true)")
    return out


def _cmd_options(m: _Model, cmd: str, base: Path) -> bool:
    """``cmd``'s llama-server options into ``m``; False when it runs something else."""
    try:
        argv = shlex.split(cmd.replace("\\\n", " "))
    except ValueError as exc:
        m.lines.append(_not_carried("cmd", cmd, f"cannot be split into arguments: {exc}"))
        return False
    if not argv or "llama-server" not in Path(argv[0]).name:
        m.lines.append(_not_carried("cmd", cmd, "not a llama-server command"))
        return False
    i = 1
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-"):
            m.lines.append(_not_carried("argument", arg, "not an option"))
            continue
        key, eq, value = arg.lstrip("-").partition("=")
        if not eq:
            if i < len(argv) and not (argv[i].startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", argv[i])):
                value = argv[i]
                i += 1
            else:
                value = "true"  # a flag
        if key.startswith("no-") and value == "true" and option_entries(key, value, base)[1] is not None:
            entries, why = option_entries(key[3:], "false", base)
        else:
            entries, why = option_entries(key, value, base)
        if key in ("port", "host"):
            continue  # llama-swap's ${PORT}: corral runs its own workers
        if why is not None:
            m.lines.append(_not_carried(f"--{key}", value, why))
        m.put(entries)
    return True
