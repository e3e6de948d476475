"""The `corral` command. Each group of commands lives in its own module and registers here."""

from __future__ import annotations

import typer

from corral.cli import (cache_cmds, config_cmds, create_cmd, keys_cmds, model_cmds, run_cmd, search_cmd, serve_cmd,
                        store_cmds)

app = typer.Typer(
    name="corral",
    help="A local LLM server: many GGUF models, many users, one OpenAI-compatible API.",
    no_args_is_help=True,
    add_completion=False,
)
serve_cmd.register(app)
store_cmds.register(app)
model_cmds.register(app)
run_cmd.register(app)
keys_cmds.register(app)
cache_cmds.register(app)
search_cmd.register(app)
create_cmd.register(app)
config_cmds.register(app)

if __name__ == "__main__":
    app()
