"""Debian's chromium driven by Playwright (PyPI). Playwright's own browser download is
not used: Chromium is launched by its path."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        raise RuntimeError("chromium is not installed: `apt-get install -y chromium` "
                           "(`make test` installs it)")
    return CHROMIUM


def key_script(key: str) -> str:
    """An init script that stores the API key as the page would (before the page runs)."""
    return f"window.localStorage.setItem('corral.apiKey', {key!r});"
