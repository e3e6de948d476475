"""How a config error is worded: each names the file, the table and the key (``[server]
key 'max_queue'``, ``[models."a.b"] key 'ctx_len'``), from pydantic's errors and from
``ModelSettings``'; an unknown key says to check the spelling (corral.config.file's phases)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from corral.model.settings import SettingsError

__all__ = ["pydantic_errors", "settings_errors", "location"]

_UNKNOWN = "unknown key (check the spelling; see examples/corral.toml)"


def location(loc: tuple[Any, ...]) -> str:
    """Where in the file ``loc`` (table names, then the key) is, in words."""
    parts = [str(p) for p in loc]
    if not parts:
        return "at top level"
    if len(parts) == 1:
        return f"key '{parts[0]}' at top level"
    table = parts[:-1]
    if table[0] == "models" and len(table) >= 2:
        head = f'models."{table[1]}"' if "." in table[1] else f"models.{table[1]}"
        table = [head, *table[2:]]
    return f"[{'.'.join(table)}] key '{parts[-1]}'"


def pydantic_errors(name: str, exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = _UNKNOWN
        elif err["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{name}: {location(tuple(err['loc']))}: {msg}")
    return lines


def settings_errors(name: str, table: tuple[str, ...], exc: SettingsError) -> list[str]:
    return [f"{name}: {location((*table, key))}: {_UNKNOWN if msg.startswith('unknown key') else msg}"
            for key, msg in exc.errors]
