"""`corral create NAME -f Modelfile`: make a model on a running server from an Ollama
Modelfile (corral.config.modelfile), as ``ollama create`` does: a ``FROM`` or ``ADAPTER``
that is a local file is uploaded first (``HEAD``/``POST /api/blobs/sha256:...``, skipped
when the server has it), then ``POST /api/create`` streams its status lines."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from corral.cli.client import Api, ApiError, HostOpt, PortOpt, ServerOpt, fail, server_url
from corral.config.modelfile import parse_modelfile
from corral.errors import ConfigError

__all__ = ["register", "create", "create_body"]

out = Console(highlight=False)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    return "sha256:" + h.hexdigest()


def _local_file(ref: str, base: Path) -> Path | None:
    p = Path(ref).expanduser()
    p = p if p.is_absolute() else base / p
    return p if p.is_file() else None


def create_body(name: str, text: str, base: Path, *, label: str = "Modelfile"
                ) -> tuple[dict[str, Any], dict[str, Path]]:
    """The /api/create body of a Modelfile, and the local files it needs uploaded (by digest)."""
    mf = parse_modelfile(text, name=label)
    uploads: dict[str, Path] = {}
    body: dict[str, Any] = {"model": name, "stream": True}
    src = _local_file(mf.source, base)
    if src is not None:
        d = _digest(src)
        uploads[d] = src
        body["files"] = {src.name: d}
    else:
        body["from"] = mf.source
    adapters: dict[str, str] = {}
    for a in mf.adapters:
        p = _local_file(a, base)
        if p is None:
            raise ConfigError(f"{label}: ADAPTER {a}: no such file")
        d = _digest(p)
        uploads[d] = p
        adapters[p.name] = d
    if adapters:
        body["adapters"] = adapters
    for key, value in (("system", mf.system), ("template", mf.template)):
        if value is not None:
            body[key] = value
    if mf.parameters:
        body["parameters"] = mf.parameters
    if mf.messages:
        body["messages"] = mf.messages
    if mf.license:
        body["license"] = mf.license
    return body, uploads


def create(name: str = typer.Argument(..., help="the new model's name"),
           file: Path = typer.Option(Path("Modelfile"), "--file", "-f", help="the Modelfile"),
           host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt) -> None:
    """Make a model from an Ollama Modelfile on the running server."""
    try:
        text = file.read_text(encoding="utf-8")
        body, uploads = create_body(name, text, file.resolve().parent, label=str(file))
    except ConfigError as exc:
        fail(exc.message, 2)
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{file}: cannot read: {getattr(exc, 'strerror', None) or exc}", 2)
    with Api(server_url(host, port, server), timeout=None) as api:
        try:
            for digest, path in uploads.items():
                try:
                    api.client.head(f"/api/blobs/{digest}").raise_for_status()
                    continue  # the server has it
                except Exception:  # noqa: BLE001 - 404 (or no answer yet): upload it
                    pass
                out.print(f"uploading {path.name} ({digest[:19]}…)")
                with open(path, "rb") as f:
                    r = api.client.post(f"/api/blobs/{digest}", content=f)
                if r.status_code >= 400:
                    raise ApiError(r)
            with api.stream("POST", "/api/create", json=body) as r:
                for line in r.iter_lines():
                    if line.strip():
                        msg = json.loads(line)
                        if "error" in msg:
                            fail(str(msg["error"]))
                        out.print(msg.get("status", ""))
        except ApiError as exc:
            fail(str(exc))


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `corral` app."""
    app.command("create")(create)
