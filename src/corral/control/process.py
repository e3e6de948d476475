"""Starting, signalling and describing worker processes (no state: the instance owns that).

A worker is ``python -m corral.worker --fd N --settings JSON`` in its own session
(``start_new_session=True``: its process group is ours to kill as a whole). The router
keeps one end of a ``socketpair``; the worker inherits the other as fd N.
Its stdout and stderr go to a log file whose last lines explain a failure. Logs are the
owner's only (directory 0700 when corral creates it, files 0600), and each spawn starts a
fresh file (the previous one is kept as ``.log.1``), so a failure reason never shows
what an earlier load of that name (perhaps another client's) wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import msgspec

from corral import wire
from corral.model_ids import file_stem

__all__ = ["Launcher", "describe_exit", "log_tail", "kill_group"]


@dataclass
class Launcher:
    """How to start workers; shared by all instances of a router."""

    log_dir: Path
    worker_command: list[str] = field(default_factory=lambda: [sys.executable, "-m", "corral.worker"])
    load_timeout_s: float = 300.0
    stop_grace_s: float = 5.0
    max_restarts: int = 3
    restart_backoff_s: float = 1.0

    def log_path(self, model_id: str, index: int) -> Path:
        return self.log_dir / f"{file_stem(model_id)}.{index}.log"

    async def spawn(self, settings: wire.WorkerSettings
                    ) -> tuple[asyncio.subprocess.Process, socket.socket, Path]:
        """Start one worker. Returns the process, the router's socket end and the log path."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_path = self.log_path(settings.model_id, settings.instance)
        try:
            log = _open_private_log(self.log_dir, log_path)
        except BaseException:
            parent.close()
            child.close()
            raise
        try:
            with log:
                argv = [*self.worker_command, "--fd", str(child.fileno()),
                        "--settings", msgspec.json.encode(settings).decode()]
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    pass_fds=(child.fileno(),), start_new_session=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        return proc, parent, log_path


def _open_private_log(log_dir: Path, log_path: Path) -> IO[bytes]:
    """A fresh owner-only log file (the previous one becomes ``.log.1``)."""
    if not log_dir.is_dir():
        log_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(log_dir, 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.replace(log_path, log_path.with_name(log_path.name + ".1"))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


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
