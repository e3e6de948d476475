"""Where the server keeps its state: ``[server] state_dir``, else ``$CORRAL_STATE_DIR``,
else ``$XDG_STATE_HOME/corral``, else ``~/.local/state/corral``. The router (usage.db, the
prompt cache's directory it gives each worker) and the CLI (``corral cache``) read it here.
What the server keeps there holds prompts and usage: ``private_dir`` makes a directory
0700 and ``private_sqlite`` a database 0600 (its -wal and -shm follow), whatever the umask.
Imports nothing of corral."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["state_dir", "prompt_cache_dir", "private_dir", "private_sqlite", "PROMPT_CACHE_DIR_NAME"]

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
    """The prompt cache's files (corral/state/cache_files.py): ``<state_dir>/prompt-cache``."""
    return state_dir(configured) / PROMPT_CACHE_DIR_NAME


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter: made 0700 (its parents as usual), or
    narrowed to 0700 when it is this process's and wider (a state dir an older corral made)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)  # the umask can only narrow 0700
    st = os.stat(path)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    return path


def private_sqlite(path: Path) -> None:
    """A SQLite database file 0600 before SQLite opens it: created so (no link followed), or
    narrowed. SQLite gives the -wal and -shm it creates the database's mode; ones already
    there are narrowed too."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for side in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            os.chmod(side, 0o600, follow_symlinks=False)
        except FileNotFoundError:
            pass
