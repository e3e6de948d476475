"""The local transport: a worker as a child process of the router, on a ``socketpair``.

``LocalSpawner`` starts ``python -m corral.worker --fd N`` (also for clients that are not the
router: tests, bench/); ``SocketLink`` is its ``WorkerLink`` over the socket (frames in
through ``FrameReader``; terminate and kill reach the worker's whole process group).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import msgspec

from corral import wire
from corral.control.transport.link import FrameReader, LinkExit, LinkOwner, Placement, WorkerLink
from corral.control.transport.process import kill_group, log_tail, open_private_log
from corral.children.exits import describe_exit
from corral.model.ids import file_stem

__all__ = ["LocalSpawner", "SocketLink"]

log = logging.getLogger("corral.link")


class LocalSpawner:
    """Starts a worker as a child process of the router on a ``socketpair``.

    ``python -m corral.worker --fd N --settings JSON`` in its own session
    (``start_new_session=True``: its process group is ours to signal as a whole); its
    stdout and stderr go to ``<log_dir>/<model>.<instance>.log``. ``spawn_process`` starts
    the same worker for a client that is not the router (tests, bench/)."""

    def __init__(self, log_dir: Path, worker_command: list[str] | None = None) -> None:
        self.log_dir = log_dir
        self.worker_command = worker_command or [sys.executable, "-m", "corral.worker"]

    def log_path(self, model_id: str, index: int) -> Path:
        return self.log_dir / f"{file_stem(model_id)}.{index}.log"

    def command(self, settings: wire.WorkerSettings, fd: int) -> list[str]:
        """The worker's command line: it talks over the inherited socket ``fd``."""
        return [*self.worker_command, "--fd", str(fd), "--settings", msgspec.json.encode(settings).decode()]

    def environment(self, settings: wire.WorkerSettings) -> dict[str, str]:
        """Ours, unbuffered, pinned to the settings' GPUs (``devices``) where they name some."""
        return {**os.environ, "PYTHONUNBUFFERED": "1", **settings.device_env(os.environ)}

    async def spawn(self, settings: wire.WorkerSettings, owner: LinkOwner) -> "SocketLink":
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_path = self.log_path(settings.model_id, settings.instance)
        try:
            with open_private_log(self.log_dir, log_path) as log_file:
                proc = await asyncio.create_subprocess_exec(
                    *self.command(settings, child.fileno()), stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file, stderr=log_file, pass_fds=(child.fileno(),), start_new_session=True,
                    env=self.environment(settings),
                )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        link = SocketLink(owner, proc, log_path)
        await link.connect(parent)
        return link

    def spawn_process(self, settings: wire.WorkerSettings, *, stdout: int | IO[Any] | None,
                      stderr: int | IO[Any] | None, env: Mapping[str, str] | None = None,
                      ) -> tuple[subprocess.Popen[bytes], socket.socket]:
        """The worker ``spawn`` starts (same command line, environment and session) as a
        plain ``subprocess.Popen``, output where the caller says, ``env`` added to its
        environment; returns it and our end of its socketpair (blocking, the caller's to
        close). For clients that drive one worker themselves, not for the router."""
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc = subprocess.Popen(
                self.command(settings, child.fileno()), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                pass_fds=(child.fileno(),), start_new_session=True, env={**self.environment(settings), **(env or {})},
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return proc, parent


class SocketLink(WorkerLink):
    """A local worker process and the router's end of its socketpair."""

    def __init__(self, owner: LinkOwner, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        super().__init__(owner, log_path)
        self._proc = proc
        self._placement = Placement(pid=proc.pid)
        self._waiter = asyncio.get_running_loop().create_task(self._wait_exit(),
                                                              name=f"reap worker {proc.pid}")

    async def connect(self, sock: socket.socket) -> None:
        """Read the socket; when that fails, the worker is killed (its exit follows)."""
        try:
            transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
                lambda: FrameReader(self.receive, self.closed), sock)
            self._transport = transport
        except OSError as exc:
            sock.close()
            log.warning("cannot talk to worker %d: %s; killing it", self._proc.pid, exc)
            self.kill()

    async def _wait_exit(self) -> None:
        rc = await self._proc.wait()
        if self._transport is not None:
            self._transport.close()
        kill_group(self._proc.pid, signal.SIGKILL)  # whatever else its group left behind
        self.exited(LinkExit(rc, f"worker {describe_exit(rc)}"))

    @property
    def placement(self) -> Placement:
        return self._placement

    def terminate(self) -> None:
        kill_group(self._proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self._exit is None:
            kill_group(self._proc.pid, signal.SIGKILL)

    def log_tail(self) -> str:
        return log_tail(self.log_path)
