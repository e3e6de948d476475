"""Runs the real `corral` command in a subprocess (what a person types)."""

from __future__ import annotations

import subprocess
import sys

from ui.server import clean_env


def corral(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout,
                          env=clean_env(COLUMNS="200", **(env or {})),
                          stdin=None if stdin is not None else subprocess.DEVNULL)
