"""Ollama's Modelfile, read (``corral create NAME -f Modelfile``, ``corral config import``).

    FROM llama3.2            # a model name, or a GGUF file (relative: to the Modelfile)
    PARAMETER temperature 0.6
    PARAMETER stop "<|im_end|>"
    SYSTEM \"\"\"You are Mario.\"\"\"
    TEMPLATE \"\"\"...\"\"\"
    ADAPTER ./lora.gguf
    MESSAGE user Who are you?
    LICENSE \"\"\"MIT\"\"\"

Instructions are case-insensitive; a value may be quoted, or triple-quoted over several
lines; ``#`` starts a comment line. ``parse_modelfile`` returns a ``Modelfile`` whose
``parameters`` are values as Ollama would send them (numbers as numbers, ``stop`` a list);
an unknown instruction, a line without a value or a second FROM is a ``ConfigError``
naming the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from corral.errors import ConfigError

__all__ = ["Modelfile", "parse_modelfile", "MAX_MODELFILE_BYTES", "PARAMETERS"]

# Ollama's PARAMETER names -> the model setting (generation defaults, and a few a load fixes)
PARAMETERS = {n: n for n in ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty",
                             "repeat_last_n", "presence_penalty", "frequency_penalty", "seed", "stop")}
PARAMETERS.update(num_predict="default_max_tokens", num_gpu="n_gpu_layers", num_thread="threads",
                  num_batch="n_batch", num_ctx="ctx_len")

MAX_MODELFILE_BYTES = 1 << 20
_INSTRUCTIONS = ("from", "parameter", "system", "template", "adapter", "message", "license", "requires")


@dataclass
class Modelfile:
    source: str  # FROM
    parameters: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    template: str | None = None
    adapters: list[str] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    lines: dict[str, int] = field(default_factory=dict)  # instruction (or "parameter NAME") -> its line


def _value(text: str) -> str:
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] == '"':
        try:
            return str(json.loads(t))
        except ValueError:
            return t[1:-1]
    return t


def _number(v: str) -> Any:
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    return v


def _entries(text: str, name: str) -> list[tuple[int, str, str]]:
    """(line, instruction, argument text) with triple-quoted values joined."""
    out: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        line = raw.strip()
        no = i + 1
        i += 1
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if '"""' in rest:
            head, _, tail = rest.partition('"""')
            if '"""' in tail:
                body, _, _ = tail.partition('"""')
            else:
                parts = [tail]
                while i < len(lines) and '"""' not in lines[i]:
                    parts.append(lines[i])
                    i += 1
                if i >= len(lines):
                    raise ConfigError(f"{name}: line {no}: a \"\"\" value that never ends")
                parts.append(lines[i].partition('"""')[0])
                i += 1
                body = "\n".join(parts)
            rest = (head + body) if head.strip() else body
            out.append((no, word.lower(), "\x00" + rest))  # \x00: taken as it is (no unquoting)
        else:
            out.append((no, word.lower(), rest))
    return out


def parse_modelfile(text: str, *, name: str = "Modelfile") -> Modelfile:
    if len(text.encode("utf-8")) > MAX_MODELFILE_BYTES:
        raise ConfigError(f"{name}: larger than {MAX_MODELFILE_BYTES} bytes")
    source: str | None = None
    mf = Modelfile(source="")
    for no, word, arg in _entries(text, name):
        raw = arg.startswith("\x00")
        arg = arg[1:] if raw else arg
        if word not in _INSTRUCTIONS:
            raise ConfigError(f"{name}: line {no}: unknown instruction {word.upper()!r} "
                              f"(a Modelfile has {', '.join(w.upper() for w in _INSTRUCTIONS)})")
        if not arg.strip() and word not in ("system", "template", "license"):
            raise ConfigError(f"{name}: line {no}: {word.upper()} needs a value")
        value = arg if raw else _value(arg)
        if word == "from":
            if source is not None:
                raise ConfigError(f"{name}: line {no}: a second FROM (a Modelfile has one)")
            source = value
        elif word == "parameter":
            key, _, v = arg.strip().partition(" ")
            if not v.strip():
                raise ConfigError(f"{name}: line {no}: PARAMETER {key} needs a value")
            val = _value(v) if not raw else v
            if key == "stop":
                mf.parameters.setdefault("stop", []).append(val)
            else:
                mf.parameters[key] = _number(val) if not val.startswith('"') else val
            mf.lines[f"parameter {key}"] = no
            continue
        elif word == "system":
            mf.system = value
        elif word == "template":
            mf.template = value
        elif word == "adapter":
            mf.adapters.append(value)
        elif word == "message":
            role, _, content = value.strip().partition(" ")
            if role not in ("system", "user", "assistant"):
                raise ConfigError(f"{name}: line {no}: MESSAGE takes a role (system, user, assistant), not {role!r}")
            mf.messages.append({"role": role, "content": _value(content) if not raw else content})
        elif word == "license":
            mf.license.append(value)
        elif word == "requires":
            pass  # an Ollama version requirement: nothing to do here
        mf.lines[word] = no
    if source is None:
        raise ConfigError(f"{name}: no FROM (the model or GGUF file to start from)")
    mf.source = source
    return mf
