"""`corral keys add | ls | rm | rotate`: the keys file, edited in place; `corral usage`.

The keys commands work on the file itself (``--keys-file PATH``, else
``$CORRAL_KEYS_FILE``), not through a server: a running router that has the file as
``[server] keys_file`` sees every change on its next request. Writes are atomic
(``corral.config.keys_file.write_keys``) and serialized by a lock file next to it
(``PATH.lock``), so two commands at once lose nothing. Both keep their owner and mode:
the keys file its own (``write_keys``), a new lock file the keys file's owner and 0600; a
command that cannot keep them (not root, another user's file) refuses and changes nothing.

``add`` and ``rotate`` print the new secret alone on the last line of their output
(scripts: ``corral keys add bob --keys-file k.toml | tail -n 1``); it is shown once and
never stored (the file holds its sha256).

`corral usage` asks a running server (GET /usage) for requests and tokens per key,
model and day.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from corral.cli.client import (
    Api,
    ApiError,
    HostOpt,
    PortOpt,
    ServerOpt,
    fail,
    server_url,
)
from corral.errors import ConfigError
from corral.config.keys_file import (
    SCOPES,
    KeySpec,
    hash_secret,
    locked_keys,
    name_problem,
    new_secret,
    now_iso,
    read_keys,
)

__all__ = ["register"]

out = Console(highlight=False)
keys_app = typer.Typer(help="Keys of a corral server: add, list, remove, rotate (the keys file).",
                       no_args_is_help=True)

KeysFileOpt = typer.Option(None, "--keys-file", help="the keys file ([server] keys_file; default: "
                           "$CORRAL_KEYS_FILE)", show_default=False)


ModelsOpt = typer.Option([], "--models", help="a model id, alias or glob pattern the key may use "
                         "(repeat; none: every model)")


def _path(keys_file: Path | None) -> Path:
    if keys_file is None:
        env = os.environ.get("CORRAL_KEYS_FILE")
        if not env:
            fail("which keys file? pass --keys-file PATH (or set CORRAL_KEYS_FILE)")
        keys_file = Path(env)
    return keys_file.expanduser()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[dict[str, KeySpec]]:
    """The file's keys, under its lock (``keys_file.locked_keys``); what the body leaves in the
    dict is written; a problem is one line."""
    try:
        with locked_keys(path) as keys:
            yield keys
    except ConfigError as exc:
        fail(exc.message)


def _scopes(raw: str) -> tuple[str, ...]:
    scopes = tuple(dict.fromkeys(s.strip() for s in raw.split(",") if s.strip()))
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        fail(f"--scopes: {bad[0] if bad else raw!r} is not a scope (scopes: {', '.join(SCOPES)})")
    return scopes


def add(name: str = typer.Argument(..., help="the key's name (usage and metrics are counted by it)"),
        keys_file: Path | None = KeysFileOpt,
        scopes: str = typer.Option("infer", "--scopes", help="comma-separated: infer, manage, admin"),
        models: list[str] = ModelsOpt,
        rpm: int | None = typer.Option(None, "--rpm", min=1, help="requests per minute"),
        tpm: int | None = typer.Option(None, "--tpm", min=1, help="tokens per minute"),
        tpd: int | None = typer.Option(None, "--tpd", min=1, help="tokens per day (UTC)"),
        concurrency: int | None = typer.Option(None, "--concurrency", min=1, help="requests in flight"),
        queue: int | None = typer.Option(None, "--queue", min=0,
                                            help="requests waiting for a place (default: no bound)"),
        weight: float = typer.Option(1.0, "--weight", help="fair-share weight (> 0)"),
        max_priority: int = typer.Option(0, "--max-priority", help="highest request priority allowed"),
        cache_group: str | None = typer.Option(None, "--cache-group",
                                               help="share the prompt cache with this group's keys")) -> None:
    """Add a key; prints its secret (once) on the last line."""
    problem = name_problem(name)
    if problem is not None:
        fail(f"invalid key name {name!r}: {problem}")
    if not weight > 0:
        fail("--weight must be > 0")
    path = _path(keys_file)
    secret = new_secret()
    spec = KeySpec(hash=hash_secret(secret), prefix=secret[:8], scopes=_scopes(scopes), models=tuple(models),
                   rpm=rpm, tpm=tpm, tpd=tpd, concurrency=concurrency, queue=queue, weight=weight,
                   max_priority=max_priority, cache_group=cache_group, created=now_iso())
    with _locked(path) as keys:
        if name in keys:
            fail(f"key {name!r} already exists in {path}; `corral keys rotate {name}` gives it a new secret")
        keys[name] = spec
    out.print(f"added key {name!r} to {path} (scopes: {', '.join(spec.scopes)}); its secret, shown once:")
    typer.echo(secret)


def _limits(spec: KeySpec) -> str:
    parts = [f"{f}={getattr(spec, f)}" for f in ("rpm", "tpm", "tpd", "concurrency", "queue")
             if getattr(spec, f) is not None]
    return " ".join(parts) or "-"


def ls(keys_file: Path | None = KeysFileOpt,
       as_json: bool = typer.Option(False, "--json", help="print JSON (never the secrets: there are none)")) -> None:
    """List the keys: name, scopes, models, limits (never a secret: only its first characters)."""
    path = _path(keys_file)
    try:
        keys = read_keys(path)
    except ConfigError as exc:
        fail(exc.message)
    if as_json:
        typer.echo(json.dumps([{"name": n, **msgspec.structs.asdict(s)} for n, s in sorted(keys.items())],
                              indent=2))
        return
    if not keys:
        out.print(f"no keys in {path}")
        return
    table = Table(show_edge=False, pad_edge=False)
    for col in ("NAME", "PREFIX", "SCOPES", "MODELS", "LIMITS", "WEIGHT", "MAX PRIORITY", "CREATED"):
        table.add_column(col)
    for name, s in sorted(keys.items()):
        table.add_row(name, s.prefix or "-", ",".join(s.scopes), ",".join(s.models) or "*", _limits(s),
                      f"{s.weight:g}", str(s.max_priority), s.created or "-")
    out.print(table)


def rm(name: str = typer.Argument(..., help="the key to remove (refused from the next request on)"),
       keys_file: Path | None = KeysFileOpt) -> None:
    """Remove a key: a server reading the file refuses it at once (running requests finish)."""
    path = _path(keys_file)
    with _locked(path) as keys:
        if name not in keys:
            fail(f"no key {name!r} in {path}")
        del keys[name]
    out.print(f"removed key {name!r} from {path}")


def rotate(name: str = typer.Argument(..., help="the key to give a new secret"),
           keys_file: Path | None = KeysFileOpt) -> None:
    """A new secret for a key (same name, scopes and limits); the old one is refused at once."""
    path = _path(keys_file)
    secret = new_secret()
    with _locked(path) as keys:
        if name not in keys:
            fail(f"no key {name!r} in {path}")
        keys[name] = msgspec.structs.replace(keys[name], hash=hash_secret(secret), prefix=secret[:8])
    out.print(f"rotated key {name!r} in {path}; its new secret, shown once:")
    typer.echo(secret)


def usage(host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt,
          key: str | None = typer.Option(None, "--key", help="only this key"),
          model: str | None = typer.Option(None, "--model", help="only this model"),
          since: str | None = typer.Option(None, "--since", help="from this day on (YYYY-MM-DD)"),
          now: bool = typer.Option(False, "--now", help="who is running and queued now, per key and model"),
          as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Requests, tokens, queue time, 429s and 503s per key, model and day (GET /usage of a running server)."""
    params = {k: v for k, v in (("key", key), ("model", model), ("since", since)) if v is not None}
    with Api(server_url(host, port, server)) as api:
        try:
            rows: list[dict[str, Any]] = api.get("/usage/now" if now else "/usage", params={} if now else params)["data"]
        except ApiError as exc:
            fail(str(exc))
    if now:
        _print_now(rows, as_json)
        return
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        out.print("no usage yet")
        return
    cols = (("DAY", "day"), ("KEY", "key"), ("MODEL", "model"), ("REQUESTS", "requests"),
            ("PROMPT TOKENS", "prompt_tokens"), ("COMPLETION TOKENS", "completion_tokens"),
            ("CACHED TOKENS", "cached_tokens"), ("QUEUE S", "queue_ms"), ("429S", "limited"),
            ("503S", "unavailable"))
    table = Table(show_edge=False, pad_edge=False)
    for title, field in cols:
        table.add_column(title, justify="left" if field in ("day", "key", "model") else "right")
    for r in rows:
        table.add_row(*(f"{r.get(f, 0) / 1000:.1f}" if f == "queue_ms" else str(r.get(f, 0)) for _, f in cols))
    out.print(table)


def _print_now(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        out.print("nobody is running or queued now")
        return
    table = Table(show_edge=False, pad_edge=False)
    for col in ("KEY", "MODEL", "RUNNING", "QUEUED"):
        table.add_column(col, justify="right" if col in ("RUNNING", "QUEUED") else "left")
    for r in rows:
        table.add_row(r["key"], r["model"], str(r["running"]), str(r["queued"]))
    out.print(table)


def register(app: typer.Typer) -> None:
    """Adds `corral keys ...` and `corral usage` to the `corral` app."""
    keys_app.command("add")(add)
    keys_app.command("ls")(ls)
    keys_app.command("rm")(rm)
    keys_app.command("rotate")(rotate)
    app.add_typer(keys_app, name="keys")
    app.command("usage")(usage)
