"""`corral ps`, `corral load`, `corral unload`, `corral show`: a running server's models.

Routes used: GET /models, POST /models/load, POST /models/unload, GET /models/show?model=ID.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral import wire
from corral.units import fmt_bytes
from corral.cli.client import Api, ApiError, HostOpt, PortOpt, ServerOpt, fail, server_url

__all__ = ["register", "until_unload", "print_ps", "processor"]

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def until_unload(m: dict[str, Any], now: float | None = None) -> str:
    """When the TTL will unload this model: 'busy', 'pinned', 'never', or '4 min 10 s'."""
    settings = m.get("settings") or {}
    if settings.get("pinned"):
        return "pinned"
    ttl = settings.get("ttl_s")
    if not ttl:
        return "never (no ttl)"
    if any((i.get("slots") or {}).get("busy") for i in m.get("instances", [])) or m.get("queued"):
        return "busy"
    last = m.get("last_used") or 0
    left = max(0.0, last + ttl - (now if now is not None else time.time()))
    s = int(round(left))
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"


def processor(placement: list[dict[str, Any]]) -> str:
    """Where an instance runs, as ``ollama ps`` says it: "100% GPU", "100% CPU" or
    "48%/52% CPU/GPU", by the bytes of its placement (weights, KV, compute), leaving out
    the token embeddings (a lookup that llama.cpp keeps on the host in every case)."""
    cpu, gpu = wire.host_and_gpu_bytes(msgspec.convert(placement, list[wire.DevicePlacement]))
    if not gpu + cpu:
        return "-"
    if not gpu or not cpu:
        return "100% GPU" if gpu else "100% CPU"
    share = math.floor(100 * cpu / (cpu + gpu) + 0.5)  # as Go's math.Round in ollama ps
    return f"{share}%/{100 - share}% CPU/GPU"


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def ps(host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt,
       as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The models the server has loaded (or is loading): instances, slots, memory, TTL."""
    with Api(server_url(host, port, server)) as api:
        models = [m for m in api.models() if m.get("instances")]
    if as_json:
        _print_json(models)
        return
    if not models:
        out.print("no model is loaded")
        return
    print_ps(out, models, time.time())


_PS_COLUMNS = ("MODEL", "INSTANCE", "PID", "STATE", "SLOTS", "MEMORY", "PROCESSOR", "THREADS", "UNTIL")
_PS_WRAPPING = ("MEMORY", "PROCESSOR", "UNTIL")  # may wrap between their words to fit a terminal


def print_ps(console: Console, models: list[dict[str, Any]], now: float) -> None:
    """``corral ps``'s table. Nothing in it is cut, the model id least of all (it is what a
    person greps for and copies into the next command). In a terminal too narrow for the
    rows, the columns of several words wrap between words if that makes them fit; else
    (and piped) every row is printed whole, as ``ollama ps`` does: the terminal wraps it."""
    rows: list[list[str]] = []
    for m in models:
        until = until_unload(m, now)
        for n, inst in enumerate(m["instances"]):
            mem = inst.get("memory") or {}
            slots = inst.get("slots") or {}
            used = (mem.get("model_bytes") or 0) + (mem.get("kv_bytes") or 0)
            rows.append([str(m["id"]) if n == 0 else "", f"#{inst['index']}", str(inst.get("pid") or "-"),
                         str(inst["state"]), f"{slots.get('busy', 0)}/{slots.get('total', 0)}",
                         fmt_bytes(used) if used else "-", processor(inst.get("placement") or []),
                         str(inst.get("threads") or "-"), until if n == 0 else ""])
    cells = [[head, *(r[k] for r in rows)] for k, head in enumerate(_PS_COLUMNS)]
    natural = [max(map(len, col)) for col in cells]
    narrowest = [max(len(w) for c in col for w in c.split() or [""]) if head in _PS_WRAPPING else natural[k]
                 for k, (head, col) in enumerate(zip(_PS_COLUMNS, cells))]
    gaps = 2 * (len(_PS_COLUMNS) - 1)  # one space of padding each side between columns
    widths = natural
    if console.is_terminal and sum(natural) + gaps > console.width >= sum(narrowest) + gaps:
        widths = list(narrowest)
        spare = console.width - gaps - sum(widths)
        for k, head in enumerate(_PS_COLUMNS):  # the room left, to the wrapping columns in turn
            if head in _PS_WRAPPING:
                more = min(spare, natural[k] - widths[k])
                widths[k] += more
                spare -= more
    table = Table(box=None, pad_edge=False)
    for head, width in zip(_PS_COLUMNS, widths):
        table.add_column(head, width=width, no_wrap=head not in _PS_WRAPPING)
    for r in rows:
        table.add_row(*(Text(c) for c in r))
    if sum(widths) + gaps > console.width:  # rich would shrink (cut) columns to fit: a console as wide
        console = Console(file=console.file, width=sum(widths) + gaps, highlight=False,
                          force_terminal=console.is_terminal, no_color=console.no_color)
    console.print(table, crop=False)


def load(model: str = typer.Argument(..., help="model id or alias"),
         host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt) -> None:
    """Load a model (returns once it is ready)."""
    with Api(server_url(host, port, server), timeout=None) as api:
        try:
            with err.status(f"loading {model}…"):
                api.post("/models/load", {"model": model})
        except ApiError as exc:
            fail(str(exc))
    out.print(Text(f"loaded {model}"))


def unload(model: str = typer.Argument(..., help="model id or alias"),
           host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt) -> None:
    """Unload a model (stops its workers; a download of it is cancelled)."""
    with Api(server_url(host, port, server), timeout=120) as api:
        try:
            api.post("/models/unload", {"model": model})
        except ApiError as exc:
            fail(str(exc))
    out.print(Text(f"unloaded {model}"))


def show(model: str = typer.Argument(..., help="model id or alias"),
         host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt,
         as_json: bool = typer.Option(False, "--json", help="print JSON"),
         template: bool = typer.Option(False, "--template", help="print the whole chat template")) -> None:
    """A model's GGUF metadata: architecture, parameters, quantization, context, chat template."""
    with Api(server_url(host, port, server)) as api:
        try:
            info = api.get("/models/show", params={"model": model})
        except ApiError as exc:
            fail(str(exc))
    if as_json:
        _print_json(info)
        return
    params = info.get("parameters_human") or info.get("size_label") or "-"
    rows = [("id", info["id"]), ("aliases", ", ".join(info.get("aliases") or []) or "-"),
            ("architecture", info.get("architecture") or "-"), ("name", info.get("name") or "-"),
            ("parameters", f"{params} ({info['parameters']:,})" if info.get("parameters") else params),
            ("quantization", info.get("quantization") or "-"),
            ("context length", str(info.get("context_length") or "-")),
            ("embedding length", str(info.get("embedding_length") or "-")),
            ("layers", str(info.get("block_count") or "-")),
            ("file", f"{info.get('path')} ({fmt_bytes(info['file_bytes']) if info.get('file_bytes') else '-'})"),
            ("source", info.get("source") or "-"), ("status", info.get("status") or "-")]
    if info.get("reason"):  # a failed model: why (a file that does not read as GGUF, a failed load)
        rows.append(("reason", info["reason"]))
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(str(v)))
    tpl = info.get("chat_template")
    if not tpl:
        table.add_row("chat template", "none (corral uses its plain User:/Assistant: prompt)")
    out.print(table)
    if tpl:
        lines = tpl.splitlines()
        shown = lines if template or len(lines) <= 12 else lines[:12]
        out.print(Text("chat template:", style="bold"))
        out.print(Text("\n".join("  " + line for line in shown)))
        if len(shown) < len(lines):
            out.print(Text(f"  … {len(lines) - len(shown)} more lines (--template shows all)", style="dim"))


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `corral` app."""
    app.command("ps")(ps)
    app.command("load")(load)
    app.command("unload")(unload)
    app.command("show")(show)
