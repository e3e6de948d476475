"""Where the server keeps its state: ``[server] state_dir``, else ``$CORRAL_STATE_DIR``,
else ``$XDG_STATE_HOME/corral``, else ``~/.local/state/corral``. The router (usage.db, the
prompt cache's directory it gives each worker) and the CLI (``corral cache``) read it here.
Imports nothing of corral."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir", "prompt_cache_dir", "PROMPT_CACHE_DIR_NAME"]

PROMPT_CACHE_DIR_NAME = "prompt-cache"


def state_dir(configured: Path | None) -> Path:
    if configured is not None:
        return configured
    env = os.environ.get("CORRAL_STATE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "corral"


def prompt_cache_dir(configured: Path | None) -> Path:
    """The prompt cache's files (corral/cache_files.py): ``<state_dir>/prompt-cache``."""
    return state_dir(configured) / PROMPT_CACHE_DIR_NAME
