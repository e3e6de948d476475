"""Start / wait for / stop the servers under test.

Every server runs in its own process group (``start_new_session``) bound to
127.0.0.1 on a free port; ``stop()`` kills the whole group (SIGTERM, then
SIGKILL), so no worker or model-instance child survives a benchmark. Output
goes to ``bench/results/logs/<name>.log`` and the tail is shown when a server
fails to start.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import httpx

from bench.llama_server import buffer_args

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LOGS = RESULTS / "logs"
VENV_PY = ROOT / ".venv" / "bin" / "python"
PY = str(VENV_PY) if VENV_PY.exists() else sys.executable
CORRAL = ROOT / ".venv" / "bin" / "corral"

_live: list["Server"] = []


class ServerFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


class Server:
    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        port: int,
        *,
        health_path: str = "/health",
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        self.name = name
        self.cmd = [str(c) for c in cmd]
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = str(cwd) if cwd else None
        self.proc: subprocess.Popen | None = None
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{name}.log"
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "Server":
        self._log_fh = open(self.log_path, "w")
        self._log_fh.write("$ " + " ".join(self.cmd) + "\n")
        self._log_fh.flush()
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        _live.append(self)
        return self

    def wait_healthy(self, timeout_s: float = 120.0) -> float:
        """Poll health until 200; returns seconds since start. Raises ServerFailed."""
        assert self.proc is not None
        deadline = time.perf_counter() + timeout_s
        last = ""
        with httpx.Client(timeout=5.0) as c:
            while time.perf_counter() < deadline:
                if self.proc.poll() is not None:
                    raise ServerFailed(
                        f"{self.name} exited with code {self.proc.returncode} before becoming healthy; "
                        f"log {self.log_path}:\n{tail(self.log_path)}"
                    )
                try:
                    r = c.get(self.base_url + self.health_path)
                    if r.status_code == 200:
                        return time.perf_counter() - self.started_at
                    last = f"HTTP {r.status_code} {r.text[:120]}"
                except httpx.HTTPError as e:
                    last = type(e).__name__
                time.sleep(0.1)
        raise ServerFailed(
            f"{self.name} not healthy after {timeout_s:.0f}s (last: {last}); log {self.log_path}:\n"
            f"{tail(self.log_path)}"
        )

    def stop(self, grace_s: float = 8.0) -> None:
        p = self.proc
        if p is None:
            return
        # children that put themselves in their own session (e.g. corral's workers) are not
        # in our process group: remember them now, kill any left after the server stopped
        kids = descendants(p.pid)
        try:
            pgid = os.getpgid(p.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            # the group may hold children even after the leader left
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        for pid, start in kids:
            if proc_start(pid) == start:  # the same process, not a reused pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.proc = None
        try:
            self._log_fh.close()
        except Exception:  # noqa: BLE001 - closing a log at the end of a run
            pass
        if self in _live:
            _live.remove(self)

    def vm_hwm_kb(self) -> int | None:
        """Peak resident memory (VmHWM) of the server's main process, in kB."""
        return read_status_kb(self.pid, "VmHWM") if self.pid else None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def proc_start(pid: int) -> int | None:
    f = _stat_fields(pid)
    try:
        return int(f[19]) if f else None  # field 22: starttime
    except (IndexError, ValueError):
        return None


def descendants(pid: int) -> list[tuple[int, int | None]]:
    """(pid, starttime) of every live descendant of ``pid``."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            f = _stat_fields(int(d.name))
            if f:
                try:
                    parent[int(d.name)] = int(f[1])
                except (IndexError, ValueError):
                    pass
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        for child, par in parent.items():
            if par == cur:
                out.append((child, proc_start(child)))
                todo.append(child)
    return out


def proc_cpu_s(pid: int) -> float | None:
    """CPU seconds (user+system) used by one process."""
    f = _stat_fields(pid)
    try:
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else None
    except (IndexError, ValueError):
        return None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and all its live descendants."""
    total = proc_cpu_s(pid) or 0.0
    for child, _ in descendants(pid):
        total += proc_cpu_s(child) or 0.0
    return total


def read_status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user+system) used so far by the live processes of a process group."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        # fields[0] is state (field 3); pgrp is field 5, utime 14, stime 15
        try:
            if int(fields[2]) == pgid:
                total += int(fields[11]) + int(fields[12])
        except (IndexError, ValueError):
            continue
    return total / tick


def stop_all() -> None:
    for s in list(_live):
        s.stop(grace_s=3.0)


# --------------------------------------------------------------------------- commands


def llama_server_cmd(binary: str | Path, model: str, port: int, *, n_parallel: int, slot_ctx: int,
                     threads: int, gpu_layers: int = 0, kv_unified: bool = False) -> list[str]:
    """``kv_unified``: ``-kvu``, one KV buffer shared by the slots (the same ``-c`` cells in all)."""
    return [
        str(binary), "-m", model, "--host", "127.0.0.1", "--port", str(port),
        "-np", str(n_parallel), "-c", str(n_parallel * slot_ctx), "-t", str(threads), "-tb", str(threads),
        "-cb", "--no-warmup", "-ngl", str(gpu_layers), *(["-kvu"] if kv_unified else []), *buffer_args(),
    ]


def llama_router_cmd(binary: str | Path, preset: Path, port: int, *, models_max: int = 4) -> list[str]:
    return [
        str(binary), "--models-preset", str(preset), "--models-max", str(models_max),
        "--host", "127.0.0.1", "--port", str(port),
    ]


def llama_cpp_python_cmd(model: str, port: int, *, threads: int, n_ctx: int) -> list[str]:
    return [
        PY, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(n_ctx),
        # default True: each new request aborts the one streaming; False makes them queue
        "--interrupt_requests", "False",
    ]


def corral_cmd(config: Path, port: int) -> list[str]:
    if CORRAL.exists():
        exe = [str(CORRAL)]
    elif shutil.which("corral"):
        exe = ["corral"]
    else:  # corral on PYTHONPATH only (bench/gpu/run.sh on a machine without the venv)
        exe = [sys.executable, "-c", "from corral.cli.main import app; app()"]
    return [*exe, "serve", "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
