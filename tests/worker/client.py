"""A small synchronous client for one worker process (tests and bench only).

The router's real client is async (corral.control); this one is just enough to drive
a worker over its socketpair: spawn (the router's ``LocalSpawner``: the same command line,
environment and session), send, receive with a deadline.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from corral import wire
from corral.control.transport.local import LocalSpawner

SRC = Path(__file__).resolve().parents[2] / "src"


class WorkerClient:
    def __init__(self, settings: wire.WorkerSettings) -> None:
        # the log directory is spawn()'s (the router's); this client takes stderr itself
        spawner = LocalSpawner(Path(tempfile.gettempdir()))
        self.proc, self.sock = spawner.spawn_process(
            settings, stdout=None, stderr=subprocess.PIPE,
            env={"PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")})
        self._dec = wire.FrameDecoder()
        self._queue: list[wire.FromWorker] = []

    # -- io

    def send(self, msg: wire.ToWorker) -> None:
        self.sock.sendall(wire.encode(msg))

    def recv(self, timeout: float = 60.0) -> wire.FromWorker | None:
        """Next message, or None on EOF. Raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._queue:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from the worker in time")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                raise TimeoutError("no message from the worker in time") from None
            if not data:
                return None
            self._queue.extend(wire.decode_from_worker(b) for b in self._dec.feed(data))
        return self._queue.pop(0)

    def wait_ready(self, timeout: float = 120.0) -> wire.Ready:
        first = self.recv(timeout)
        assert isinstance(first, wire.Loading), first
        msg = self.recv(timeout)
        assert isinstance(msg, wire.Ready), msg
        return msg

    def generate(self, req: wire.GenerateRequest, timeout: float = 120.0) -> tuple[str, list[wire.Delta], wire.Finished | wire.RequestFailed]:
        """Send one request and collect it (other requests must not be in flight)."""
        self.send(req)
        return self.collect(req.id, timeout)

    def collect(self, rid: str, timeout: float = 120.0) -> tuple[str, list[wire.Delta], wire.Finished | wire.RequestFailed]:
        deltas: list[wire.Delta] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.1, deadline - time.monotonic()))
            if msg is None:
                raise EOFError("worker closed the socket")
            if isinstance(msg, wire.Delta):
                assert msg.id == rid, msg
                deltas.append(msg)
            elif isinstance(msg, (wire.Finished, wire.RequestFailed)):
                assert msg.id == rid, msg
                return "".join(d.text for d in deltas), deltas, msg
            else:
                raise AssertionError(f"unexpected {msg!r}")

    # -- lifecycle

    def close(self, timeout: float = 10.0) -> int:
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            if self.proc.stderr:
                self.proc.stderr.close()

    def __enter__(self) -> "WorkerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
