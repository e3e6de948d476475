"""`corral serve` in a child process, the parts every test that starts one shares: the
command line, a free loopback port, and the stop (SIGTERM, then SIGKILL past its grace).

The starters built on these: ``ui.server.CorralServer`` (CLI flags, waits for uvicorn's
startup line), ``reliability.server.RouterProcess`` (a TOML config, waits for /health),
``ray_cluster.conftest.RayRouter`` (a Ray cluster's router, in its own session).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

__all__ = ["free_port", "serve_command", "stop_process"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(*args: str) -> list[str]:
    """``corral serve ARGS`` as a user runs it (the CLI's own entry point)."""
    return [sys.executable, "-m", "corral.cli.main", "serve", *args]


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], *, group: bool = False,
                 grace_s: float = 30.0) -> None:
    """SIGTERM (to its process group with ``group``: one started in a session of its own),
    then SIGKILL if it has not ended within ``grace_s``; nothing if it has ended already."""
    if proc.poll() is not None:
        return

    def send(sig: signal.Signals) -> None:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)

    send(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        proc.wait(10)
