"""The body of the Ray actor that runs one model instance's worker on its node.

The router's bridge creates one ``WorkerHost`` actor per instance (``ray.remote`` is
applied there, so this module imports no Ray at import time and Ray workers import it
by name: corral must be installed on every node). The actor:

1. listens on its node's address (port 0) and hands the router, via ``place()``, that
   address, the port and a fresh 32-byte token;
2. accepts one connection whose first 32 bytes are that token (others are closed) and
   starts ``python -m corral.worker --fd N`` with that connection as fd N, in its own
   session, logging to a file on the node;
3. waits for the worker's exit (``wait_exit``); ``kill()`` ends its process group.

So the wire frames go router <-> worker over one TCP connection with no process copying
them on the way (measured against relaying them through actor calls and a streaming
generator: see docs/decisions/0005-ray-direct-tcp.md). The worker is unchanged: a TCP socket is a
stream socket like the socketpair. It sets ``PR_SET_PDEATHSIG`` itself, and its parent
is the thread here that waits for it, so a killed actor takes its worker along; the
router (through its bridge) owns the actor, so Ray kills the actor when the router goes.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["WorkerHost", "TOKEN_BYTES", "node_log_dir"]

TOKEN_BYTES = 32
_TOKEN_READ_S = 5.0


def node_log_dir() -> Path:
    return Path(tempfile.gettempdir()) / "corral-ray-workers"


def _ray() -> Any:
    """Ray, untyped (only these two calls)."""
    import ray

    return ray


def _node_address() -> str:
    return str(_ray().util.get_node_ip_address())


def _node_id() -> str:
    return str(_ray().get_runtime_context().get_node_id())


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class WorkerHost:
    """One worker process on this node, reachable by one authenticated connection."""

    def __init__(self, key: str, settings_json: str, worker_command: list[str] | None,
                 accept_timeout_s: float = 60.0) -> None:
        self._key = key
        self._settings_json = settings_json
        self._command = worker_command or [sys.executable, "-m", "corral.worker"]
        self._token = secrets.token_bytes(TOKEN_BYTES)
        self._address = _node_address()
        self._listener = socket.create_server((self._address, 0))
        self._port = int(self._listener.getsockname()[1])
        self._accept_deadline = time.monotonic() + accept_timeout_s
        log_dir = node_log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in key)
        self._log_path = log_dir / f"{safe}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._rc: int | None = None
        self._failure: str | None = None
        self._exited = threading.Event()
        self._killed = False
        threading.Thread(target=self._run, name="worker-host", daemon=True).start()

    def place(self) -> dict[str, Any]:
        return {"node_id": _node_id(), "node_address": self._address,
                "hostname": socket.gethostname(), "host": self._address, "port": self._port,
                "token": self._token, "actor_pid": os.getpid(),
                "log_path": str(self._log_path)}

    def wait_exit(self) -> tuple[int | None, str | None, str, int | None]:
        """Blocks until the worker exited: (rc, failure, last log lines, worker pid)."""
        self._exited.wait()
        pid = self._proc.pid if self._proc is not None else None
        return self._rc, self._failure, _log_tail(self._log_path), pid

    def kill(self) -> None:
        self._killed = True
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._listener.close()

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        try:
            conn = self._accept()
            if conn is None:
                return
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with open(self._log_path, "ab") as log:
                    self._proc = subprocess.Popen(
                        [*self._command, "--fd", str(conn.fileno()), "--settings", self._settings_json],
                        stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(conn.fileno(),),
                        start_new_session=True,
                        env={**os.environ, "PYTHONUNBUFFERED": "1", **_device_env(self._settings_json)})
            finally:
                conn.close()
            if self._killed:
                self.kill()
            self._rc = self._proc.wait()
        except Exception as exc:  # noqa: BLE001 - reported to the router as the reason
            self._failure = f"cannot start the worker on {self._address}: {exc}"
        finally:
            self._exited.set()

    def _accept(self) -> socket.socket | None:
        with self._listener:
            while not self._killed:
                left = self._accept_deadline - time.monotonic()
                if left <= 0:
                    self._failure = "the router did not connect to the worker's port in time"
                    return None
                self._listener.settimeout(left)
                try:
                    conn, _ = self._listener.accept()
                except (TimeoutError, OSError):
                    continue
                conn.settimeout(_TOKEN_READ_S)
                try:
                    got = _read_exact(conn, TOKEN_BYTES)
                except OSError:
                    got = b""
                if hmac.compare_digest(got, self._token):
                    conn.settimeout(None)
                    return conn
                conn.close()  # not the router: drop it, keep waiting
        self._failure = "stopped before the router connected"
        return None


def _device_env(settings_json: str) -> dict[str, str]:
    """``devices`` pins the worker to those GPUs of its node (numbered as on the node, not
    within the actor's CUDA_VISIBLE_DEVICES: no environment is passed to map them); unset,
    it keeps the ones Ray gave the actor (Ray sets CUDA_VISIBLE_DEVICES for it)."""
    import msgspec

    from corral import wire

    return msgspec.json.decode(settings_json, type=wire.WorkerSettings).device_env()


def _log_tail(path: Path, lines: int = 5, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [ln.rstrip() for ln in data.splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])
