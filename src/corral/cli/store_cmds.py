"""`corral pull`, `corral ls`, `corral rm`: the model store from the command line.

``pull`` and ``rm`` go through a running corral server when there is one (so the
server's catalog, events and loaded models stay right); otherwise they work on the
models dir directly (a pull still runs in its own child process). ``ls`` reads the
models dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from corral.units import fmt_bytes
from corral.cli.client import HostOpt, PortOpt, ServerOpt, api_headers, model_path, server_url
from corral.errors import CorralError
from corral.store.local import ModelStore, default_models_dir, validate_model_id

__all__ = ["register"]

TERMINAL = ("download_finished", "download_failed", "download_cancelled")

out = Console()
err = Console(stderr=True)

ModelsDirOpt = typer.Option(None, "--models-dir", help="models directory "
                            "(default: $CORRAL_MODELS_DIR or ~/.local/share/corral/models)")


def _store(models_dir: Path | None) -> ModelStore:
    return ModelStore(models_dir or default_models_dir())


def _headers() -> dict[str, str]:
    return api_headers()


def _server_running(url: str) -> bool:
    """Any HTTP answer means a server is there (even 401/404)."""
    try:
        httpx.get(f"{url}/models", headers=_headers(), timeout=1.0)
    except httpx.HTTPError:
        return False
    return True


def _error_message(r: httpx.Response) -> str:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(r.json()["error"]["message"])
    return f"HTTP {r.status_code}: {r.text[:200]}"


def _bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=False)


def _finish(ev: dict[str, Any]) -> int:
    """Print the outcome of a pull; the exit code."""
    name, model = ev["event"], ev.get("model")
    if name == "download_finished":
        out.print(f"pulled [bold]{model}[/] -> {ev.get('path')}")
        return 0
    if name == "download_cancelled":
        done = ev.get("done")
        err.print(f"cancelled {model} ({'?' if done is None else fmt_bytes(done)} kept; pull again to resume)")
        return 130
    err.print(f"[red]failed[/]: {ev.get('reason')}")
    return 1


# ---------------------------------------------------------------------- pull via server


def _pull_via_server(url: str, source: str, sha256: str | None, model_id: str | None) -> int:
    body = {"model": source, "sha256": sha256, "id": model_id}
    body = {k: v for k, v in body.items() if v is not None}
    pull_id: str | None = None
    with httpx.Client(base_url=url, headers=_headers(), timeout=None) as client:
        try:
            # Subscribe before starting the pull, so no event is missed.
            with client.stream("GET", "/models/events") as events:
                if events.status_code != 200:
                    events.read()
                    err.print(f"[red]error[/]: GET /models/events: {_error_message(events)}")
                    return 1
                r = client.post("/models/pull", json=body, timeout=600)
                if r.status_code != 202:
                    err.print(f"[red]error[/]: {_error_message(r)}")
                    return 1
                pull_id, model = r.json()["id"], r.json()["model"]
                with _bar() as bar:
                    task = bar.add_task(model, total=None)
                    for line in events.iter_lines():
                        if not line.startswith("data:"):
                            continue
                        with contextlib.suppress(ValueError):
                            ev = json.loads(line[5:].strip())
                            if ev.get("pull_id") != pull_id:
                                continue
                            if ev["event"] in ("download_started", "download_progress"):
                                bar.update(task, total=ev.get("total"),
                                           completed=ev.get("done", 0))
                            elif ev["event"] in TERMINAL:
                                if ev["event"] == "download_finished":
                                    bar.update(task, completed=ev.get("size"), total=ev.get("size"))
                                bar.stop()
                                return _finish(ev)
                err.print("[red]error[/]: the server closed the event stream")
                return 1
        except KeyboardInterrupt:
            if pull_id is None:
                raise
            r = client.delete(model_path("/models/pull", pull_id), timeout=30)
            if r.status_code == 200:
                st = r.json()
                return _finish({"event": "download_cancelled", "model": st.get("model"),
                                "done": st.get("done")})
            err.print(f"[red]error[/]: could not cancel: {_error_message(r)}")
            return 1


# ---------------------------------------------------------------------- pull locally


async def _pull_locally(store: ModelStore, source: str, sha256: str | None,
                        model_id: str | None) -> int:
    from corral.store.downloads import DownloadManager
    from corral.events import EventBus

    bus = EventBus()
    dm = DownloadManager(store, bus, allow_private=lambda: True)  # your own pull, as you: any address
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, interrupted.set)
    try:
        async with bus.subscribe() as q:
            start = asyncio.create_task(dm.start(source, sha256=sha256, model_id=model_id))
            stop = asyncio.create_task(interrupted.wait())
            await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not start.done():
                start.cancel()
                await dm.close()
                err.print("cancelled")
                return 130
            stop.cancel()
            try:
                h = start.result()
            except CorralError as exc:
                err.print(f"[red]error[/]: {exc.message}")
                return 1
            with _bar() as bar:
                task = bar.add_task(h.model_id, total=h.total, completed=h.done)
                while True:
                    get = asyncio.create_task(q.get())
                    stop = asyncio.create_task(interrupted.wait())
                    await asyncio.wait({get, stop}, return_when=asyncio.FIRST_COMPLETED)
                    if stop.done():
                        get.cancel()
                        await dm.cancel(h.pull_id)
                        interrupted.clear()
                        continue  # the download_cancelled event follows
                    stop.cancel()
                    ev = get.result()
                    if ev.get("pull_id") != h.pull_id:
                        continue
                    if ev["event"] == "download_progress":
                        bar.update(task, total=ev["total"], completed=ev["done"])
                    elif ev["event"] in TERMINAL:
                        if ev["event"] == "download_finished":
                            bar.update(task, completed=ev["size"], total=ev["size"])
                        bar.stop()
                        await h.wait()
                        return _finish(ev)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await dm.close()


# ---------------------------------------------------------------------- ls


def _served_models(url: str) -> list[dict[str, Any]] | None:
    """The running server's GET /models entries; None when no server answers."""
    try:
        r = httpx.get(f"{url}/models", headers=_headers(), timeout=2.0)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        err.print(f"note: the server at {url} answered: {_error_message(r)}")
        return None
    return list(r.json().get("data", []))


def _row_from_server(m: dict[str, Any]) -> dict[str, Any]:
    """A model the server serves that is not in this models dir (the default, config files)."""
    from corral.store.gguf import quantization_of

    path = Path(m["path"]) if m.get("path") else None
    size = None
    if path is not None:
        with contextlib.suppress(OSError):
            size = path.stat().st_size
    return {"id": m["id"], "path": str(path) if path else "-", "size": size,
            "quantization": quantization_of(path) if path is not None else None,
            "source": m.get("source")}


# ---------------------------------------------------------------------- commands


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `corral` app."""

    @app.command()
    def pull(
        source: str = typer.Argument(..., help="owner/repo/file.gguf, owner/repo:Q4_K_M, or a URL"),
        sha256: str | None = typer.Option(None, "--sha256", help="expected sha256 of the file"),
        model_id: str | None = typer.Option(None, "--id", help="model id (default: file name)"),
        host: str | None = HostOpt,
        port: int | None = PortOpt,
        server: str | None = ServerOpt,
        models_dir: Path | None = ModelsDirOpt,
    ) -> None:
        """Download a model (resumable; Ctrl-C cancels and keeps the partial file).

        Through the running server when there is one (its download, its events), else
        directly into the models dir."""
        url = server_url(host, port, server)
        if _server_running(url):
            if models_dir is not None:
                err.print(f"note: pulling into the models dir of the server at {url}")
            code = _pull_via_server(url, source, sha256, model_id)
        else:
            code = asyncio.run(_pull_locally(_store(models_dir), source, sha256, model_id))
        raise typer.Exit(code)

    @app.command("ls")
    def ls(models_dir: Path | None = ModelsDirOpt,
           host: str | None = HostOpt,
           port: int | None = PortOpt,
           server: str | None = ServerOpt,
           as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """List the models in the models dir (and the running server's models, marking
        the loaded ones)."""
        store = _store(models_dir)
        rows: list[dict[str, Any]] = [dict(m.to_dict()) for m in store.list()]
        served = _served_models(server_url(host, port, server))
        if served is not None:
            by_id = {r["id"]: r for r in rows}
            for m in served:
                row = by_id.get(m["id"])
                if row is None:
                    row = _row_from_server(m)
                    rows.append(row)
                    by_id[m["id"]] = row
                row["status"] = m["status"]["value"]
                row["loaded"] = m["status"]["value"] == "loaded"
                if m["status"]["value"] == "failed" and m["status"].get("reason"):
                    row["problem"] = m["status"]["reason"]
        if as_json:
            out.print_json(data=rows)
            return
        if not rows:
            out.print(f"no models in {store.root}")
            return
        table = Table("ID", "SIZE", "QUANT", "SOURCE", "STATUS", "PATH", box=None, pad_edge=False)
        for r in rows:
            status = r.get("status") or ("failed" if r.get("problem") else "-" if served is None else "not served")
            size = r.get("size")
            table.add_row(r["id"], "?" if size is None else fmt_bytes(size), r.get("quantization") or "-",
                          r.get("source") or "local",
                          f"[bold green]{status}[/]" if r.get("loaded") else status, str(r.get("path")))
        out.print(table)
        for r in rows:  # a file that does not read as GGUF: why (corral.store.gguf.check_file)
            if r.get("problem"):
                err.print(f"{r['id']}: failed: {r['problem']}", markup=False, highlight=False)
        if served is None:
            err.print("(no server answered: loaded models are not marked)")

    @app.command("rm")
    def rm(
        model_id: str = typer.Argument(..., metavar="ID"),
        force: bool = typer.Option(False, "--force", help="unload it first if it is loaded"),
        host: str | None = HostOpt,
        port: int | None = PortOpt,
        server: str | None = ServerOpt,
        models_dir: Path | None = ModelsDirOpt,
    ) -> None:
        """Delete a model from disk."""
        try:  # an id never holds '?', '#' or '%', and it is quoted whole ('/' too): one model route
            validate_model_id(model_id)
        except CorralError as exc:
            err.print(f"[red]error[/]: {exc.message}")
            raise typer.Exit(1) from None
        url = server_url(host, port, server)
        if _server_running(url):
            r = httpx.delete(url + model_path("/models", model_id),
                             params={"force": str(force).lower()},
                             headers=_headers(), timeout=120)
            if r.status_code != 200:
                err.print(f"[red]error[/]: {_error_message(r)}")
                raise typer.Exit(1)
            out.print(f"removed {model_id}")
            return
        try:
            removed = _store(models_dir).remove(model_id)
        except CorralError as exc:
            err.print(f"[red]error[/]: {exc.message}")
            raise typer.Exit(1) from None
        out.print(f"removed {model_id} ({removed.path})")
