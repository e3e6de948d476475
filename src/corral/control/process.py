"""Local worker processes in words and signals: exit status, log tail, process group.

Used by the local transport (``corral.control.link.SocketLink``): a worker leads its
own session, so its whole process group can be signalled; its stdout and stderr go
to a log file whose last lines explain a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

__all__ = ["describe_exit", "log_tail", "kill_group"]


def describe_exit(rc: int | None) -> str:
    """Exit status in words; SIGKILL gets the out-of-memory hint."""
    if rc is None:
        return "worker exited (status unknown)"
    if rc == 0:
        return "worker exited with code 0"
    if rc < 0:
        sig = -rc
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        text = f"worker killed by {name} (signal {sig})"
        if sig == signal.SIGKILL:
            text += ": possibly out of memory (the kernel OOM killer sends SIGKILL) or killed by an operator"
        return text
    return f"worker exited with code {rc}"


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
