"""Local worker processes: log tail, process group (the exit status in words: ``corral.children.exits``).

Used by the local transport (``corral.control.transport.local.SocketLink``): a worker leads its
own session, so its whole process group can be signalled; its stdout and stderr go
to a log file whose last lines explain a failure. Logs are the owner's only
(directory 0700 when corral creates it, files 0600), and each spawn starts a fresh file
(the previous one is kept as ``.log.1``), so a failure reason never shows what an
earlier load of that name (perhaps another client's) wrote.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO

__all__ = ["log_tail", "kill_group", "open_private_log"]


def open_private_log(log_dir: Path, log_path: Path) -> IO[bytes]:
    """A fresh owner-only log file (the previous one becomes ``.log.1``)."""
    if not log_dir.is_dir():
        log_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(log_dir, 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def log_tail(path: Path | None, lines: int = 5, max_bytes: int = 8192) -> str:
    """The last lines of a worker's log, for failure reasons."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.rstrip() for ln in data.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])


def kill_group(pid: int | None, sig: int) -> None:
    """Signal the worker's whole process group (it leads its own session)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
