"""`corral cache ls | clear`: the prompt cache's files on disk (docs/internals/prompt-cache.md).

Both work on the files themselves (``<state_dir>/prompt-cache``: ``--state-dir``, else the
``--config`` file's ``[server] state_dir``, else ``$CORRAL_STATE_DIR``, else
``$XDG_STATE_HOME/corral``), not through a server. Clearing under a running server is safe:
a worker that then misses a file it had indexed prefills the prompt.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from corral.state import cache_files
from corral.units import fmt_bytes
from corral.state.cache_files import CacheFile, CacheFileError
from corral.state.paths import prompt_cache_dir

__all__ = ["register"]

out = Console(highlight=False)
cache_app = typer.Typer(help="The prompt cache on disk: list or clear saved prompt prefixes.", no_args_is_help=True)

StateDirOpt = typer.Option(None, "--state-dir", help="the server's state dir ([server] state_dir)", show_default=False)
ConfigOpt = typer.Option(None, "--config", "-c", help="read [server] state_dir from this TOML config")


def _root(state_dir: Optional[Path], config: Optional[Path]) -> Path:
    if state_dir is None and config is not None:
        from corral.config.file import load_config
        from corral.errors import ConfigError

        try:
            state_dir = load_config(config).server.state_dir
        except ConfigError as exc:
            out.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from exc
    return prompt_cache_dir(state_dir)


def _ago(mtime: float) -> str:
    s = max(0.0, time.time() - mtime)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def ls(state_dir: Optional[Path] = StateDirOpt, config: Optional[Path] = ConfigOpt) -> None:
    """List the saved prefixes: model, tokens, size, last used (newest first)."""
    root = _root(state_dir, config)
    items = list(cache_files.scan(root))
    good = sorted((f for f in items if isinstance(f, CacheFile)), key=lambda f: -f.mtime)
    table = Table("model", "tokens", "size", "last used", "key", "file", box=None)
    for f in good:
        table.add_row(f.model_id, str(f.n_tokens), fmt_bytes(f.size), _ago(f.mtime), f.model_key[:12], f.path.name[:16])
    if good:
        out.print(table)
    bad = [e for e in items if isinstance(e, CacheFileError)]
    for e in bad:
        out.print(f"[yellow]unreadable:[/yellow] {e}")
    total = sum(f.size for f in good)
    out.print(f"{len(good)} entries, {fmt_bytes(total)} in {root}" + (f"; {len(bad)} unreadable" if bad else ""))


def clear(model: Optional[str] = typer.Argument(None, help="only this model's entries (its id)"),
          state_dir: Optional[Path] = StateDirOpt, config: Optional[Path] = ConfigOpt) -> None:
    """Delete the saved prefixes (all, or one model's)."""
    root = _root(state_dir, config)
    n, size = cache_files.clear(root, model)
    out.print(f"deleted {n} entries ({fmt_bytes(size)}) from {root}")


def register(app: typer.Typer) -> None:
    """Adds `corral cache ls | clear` to the `corral` app."""
    cache_app.command("ls")(ls)
    cache_app.command("clear")(clear)
    app.add_typer(cache_app, name="cache")
