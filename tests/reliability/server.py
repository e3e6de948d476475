"""A real `corral serve` in a child process, as users run it (CLI, uvicorn, header deadline).

``RouterProcess(tmp, models, **server)`` writes a TOML config, starts the router on a free
loopback port and waits for /health. ``worker_pids()`` reads them from GET /models;
``alive(pid)`` says whether a process still runs (zombies count as gone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from support.serve_process import free_port, serve_command, stop_process
from support.waiting import until
from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL


def toml_value(v: Any) -> str:
    if isinstance(v, Path):
        v = str(v)
    return json.dumps(v)  # JSON strings, numbers, booleans and lists are valid TOML values


def write_config(path: Path, models: dict[str, dict[str, Any]], server: dict[str, Any]) -> Path:
    lines = ["[server]"] + [f"{k} = {toml_value(v)}" for k, v in server.items()]
    lines += ["\n[defaults]", f"ctx_len = {TEST_CTX_LEN}", f"n_parallel = {TEST_N_PARALLEL}"]
    for mid, table in models.items():
        lines.append(f'\n[models."{mid}"]')
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def real_models(model_path: Path, *ids: str, **kw: Any) -> dict[str, dict[str, Any]]:
    base = {"path": str(model_path), "ctx_len": 512, "n_parallel": 4, "threads": 1}
    return {i: {**base, **kw} for i in ids}


class RouterProcess:
    def __init__(self, tmp: Path, models: dict[str, dict[str, Any]], *, api_key: str | None = None,
                 env: dict[str, str] | None = None, **server: Any) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        srv = {"host": "127.0.0.1", "port": self.port, "include_default_model": False,
               "models_dir": str(tmp / "models"), "log_dir": str(tmp / "logs"),
               "restart_backoff_s": 0.2, "stop_grace_s": 2.0, **server}
        (tmp / "models").mkdir(exist_ok=True)
        self.config_path = write_config(tmp / "corral.toml", models, srv)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "CORRAL_ADAPTIVE_THREADS": "0", **(env or {})}
        if api_key:
            self.env["CORRAL_API_KEY"] = api_key
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "router.log"

    def start(self, timeout: float = 60.0) -> "RouterProcess":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(serve_command("-c", str(self.config_path), "--log-level", "warning"),
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"router exited: {self.log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "router did not start"
            time.sleep(0.1)  # polling a child process: nothing to await

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=kw.pop("timeout", 60), **kw)

    def aclient(self, **kw: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                 timeout=kw.pop("timeout", 60), **kw)

    def worker_pids(self) -> list[int]:
        r = httpx.get(f"{self.base_url}/models", headers=self.headers, timeout=30)
        return [i["pid"] for m in r.json()["data"] for i in m.get("instances", []) if i.get("pid")]

    def router_log(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


def wait_until(pred: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll a condition of another process (nothing to await across processes)."""
    until(pred, timeout, what, interval)


def serving(r: RouterProcess) -> Iterator[RouterProcess]:
    """A module fixture's body: ``r`` started, then stopped with every worker it ran gone."""
    r.start()
    pids: list[int] = []
    try:
        yield r
        pids = r.worker_pids()
    finally:
        r.stop()
    wait_until(lambda: not [p for p in pids if alive(p)], 20, "workers to exit")
