"""`corral config import FILE`: print the corral TOML config a llama.cpp preset.ini, an Ollama
Modelfile or a llama-swap config.yaml amounts to (corral.config.importer), with a comment
at each line it could not carry over. Reads the file only; no server."""

from __future__ import annotations

from pathlib import Path

import typer

from corral.cli.client import fail
from corral.errors import ConfigError

__all__ = ["register"]

config_app = typer.Typer(help="Bring a setup from llama.cpp, Ollama or llama-swap.", no_args_is_help=True)


@config_app.command("import")
def import_cmd(file: Path = typer.Argument(..., help="a preset.ini, a Modelfile or a llama-swap config.yaml"),
               name: str | None = typer.Option(None, "--name", help="a Modelfile's model id [its file's name]")
               ) -> None:
    """Print the corral TOML config FILE amounts to (what cannot be carried over: as comments)."""
    from corral.config.importer import import_config

    try:
        typer.echo(import_config(file, name=name), nl=False)
    except ConfigError as exc:
        fail(exc.message, 2)


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `corral` app."""
    app.add_typer(config_app, name="config")
