"""Usage survives kill -9 of the router: a real `corral serve` (fake workers) is killed
with SIGKILL once its writer has flushed, and a new router reads the same counts back."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from pathlib import Path

import httpx
from reliability.server import RouterProcess, wait_until
from support.harness import FAKE, chat
from support.keys import bearer, write_keys_file


def _requests_in(db: Path) -> int:
    """Requests the database holds, read from outside the router."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
        try:
            return int(conn.execute("SELECT COALESCE(SUM(requests), 0) FROM usage").fetchone()[0])
        except sqlite3.OperationalError:  # no table yet
            return 0


def test_usage_survives_kill_9(tmp_path: Path) -> None:
    keys = write_keys_file(tmp_path / "keys.toml", alice={}, root={"scopes": ["admin"]})
    script = tmp_path / "a.json"
    script.write_text("{}")
    server = {"worker_command": [sys.executable, str(FAKE)], "keys_file": str(tmp_path / "keys.toml"),
              "state_dir": str(tmp_path / "state")}
    db = tmp_path / "state" / "usage.db"
    first = RouterProcess(tmp_path, {"a": {"path": str(script)}}, **server).start()
    try:
        with httpx.Client(base_url=first.base_url, timeout=30, headers=bearer(keys["alice"])) as c:
            for _ in range(5):
                assert c.post("/v1/chat/completions", json=chat("a")).status_code == 200
        # the writer flushes at most every second: the rows are on disk soon after
        wait_until(lambda: _requests_in(db) == 5, timeout=15, what="usage flushed")
        first.kill()  # SIGKILL: no shutdown, no last flush
    finally:
        first.stop()
    assert _requests_in(db) == 5
    second = RouterProcess(tmp_path, {"a": {"path": str(script)}}, **server).start()
    try:
        r = httpx.get(f"{second.base_url}/usage", headers=bearer(keys["root"]), timeout=30)
        assert r.status_code == 200
        [row] = r.json()["data"]
        assert (row["key"], row["model"], row["requests"], row["prompt_tokens"], row["completion_tokens"]) == \
            ("alice", "a", 5, 5, 20)
    finally:
        second.stop()
