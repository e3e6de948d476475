"""A real `corral serve` in a subprocess, for the browser and command-line tests.

``CorralServer`` starts the real router (real workers, the embedded model) on a free
port and waits for uvicorn's startup line on stderr (an event, not a sleep); ``stop()``
ends it with SIGTERM (its workers go with it).
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import httpx

from support.serve_process import free_port, serve_command, stop_process

SRC = Path(__file__).resolve().parents[2] / "src"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                        "CORRAL_HOST", "CORRAL_SERVER", "CORRAL_API_KEY")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env.update(extra)
    return env


class CorralServer:
    def __init__(self, tmp: Path, *, api_key: str | None = None, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.models_dir = tmp / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.log: list[str] = []
        self._started = threading.Event()
        cmd = serve_command("--port", str(self.port), "--models-dir", str(self.models_dir), "--ctx-len", "2048",
                            "--n-parallel", "2", *args)
        if api_key:
            cmd += ["--api-key", api_key]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=clean_env(**(env or {})),
                                     cwd=tmp)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._started.wait(60) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError("corral serve did not start:\n" + "\n".join(self.log[-30:]))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            if "Application startup complete" in line or "Uvicorn running on" in line:
                self._started.set()
        self._started.set()  # the process ended: stop waiting

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def stop(self) -> None:
        stop_process(self.proc)
        self._reader.join(5)
