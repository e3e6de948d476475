"""Usage, counted and kept: requests and tokens per key, model and UTC day, in SQLite.

Per (key, model, day): requests, prompt, completion and cached tokens, the time waited for a
slot (ms), the requests answered 429 (the key's limits) and 503 (no room, a full queue).

``UsageBook.record`` (on the event loop, once per worker request when it ends) only adds
to an in-memory map. A writer thread flushes that map to ``STATE_DIR/usage.db`` at most
every second (one transaction, an upsert per (key, model, day)), so the request path
never waits on the disk. The database is in WAL mode with ``synchronous=NORMAL``: a
committed flush survives the router being killed (kill -9); at most the last second of
counts is lost. ``close`` flushes what is left.

``query`` answers from the database plus what is not flushed yet, so GET /usage is
current. ``day_tokens`` seeds the tokens-per-day limit after a restart.

Where: ``[server] state_dir``, else ``$CORRAL_STATE_DIR``, else ``$XDG_STATE_HOME/corral``,
else ``~/.local/state/corral`` (``state_dir``). The database opens on the first flush.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from corral.control.keys.limits import utc_day
from corral.state.paths import private_dir, private_sqlite, state_dir

__all__ = ["USAGE_DB", "COUNTS", "UsageBook", "state_dir"]

log = logging.getLogger("corral.usage")

USAGE_DB = "usage.db"
# the counts of a (key, model, day) row, in this order; queue_ms: time waiting for a slot
# (the router's queue and the worker's); limited: answered 429; unavailable: answered 503
COUNTS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens", "queue_ms", "limited",
          "unavailable")
_SCHEMA = """CREATE TABLE IF NOT EXISTS usage (
    key TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, model, day))"""
_ADDED = COUNTS[3:]  # columns a database written by an older corral lacks (added on open)
_UPSERT = (f"INSERT INTO usage (key, model, day, {', '.join(COUNTS)}) VALUES (?, ?, ?, {', '.join('?' * len(COUNTS))}) "
           "ON CONFLICT (key, model, day) DO UPDATE SET "
           + ", ".join(f"{c} = {c} + excluded.{c}" for c in COUNTS))

Row = tuple[str, str, str]  # key, model, day


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=10, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(_SCHEMA)
    have = {r[1] for r in db.execute("PRAGMA table_info(usage)")}
    for col in _ADDED:
        if col not in have:
            db.execute(f"ALTER TABLE usage ADD COLUMN {col} INTEGER NOT NULL DEFAULT 0")
    db.commit()
    return db


class UsageBook:
    def __init__(self, directory: Path, flush_every_s: float = 1.0) -> None:
        self.path = directory / USAGE_DB
        self._every = flush_every_s
        self._lock = threading.Lock()
        self._pending: dict[Row, list[int]] = {}
        self._wake = threading.Event()
        self._closing = False
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()  # the writer's connection, shared with queries
        self._failed = False
        self._thread: threading.Thread | None = None  # started by the first record

    # ------------------------------------------------------------------ counting

    def record(self, key: str, model: str, *, requests: int = 0, prompt_tokens: int = 0,
               completion_tokens: int = 0, cached_tokens: int = 0, queue_ms: int = 0, limited: int = 0,
               unavailable: int = 0, day: str | None = None) -> None:
        row = (key, model, day or utc_day())
        add = (requests, prompt_tokens, completion_tokens, cached_tokens, queue_ms, limited, unavailable)
        with self._lock:
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(target=self._run, name="usage-writer", daemon=True)
                self._thread.start()
            acc = self._pending.setdefault(row, [0] * len(COUNTS))
            for i, v in enumerate(add):
                acc[i] += v

    # ------------------------------------------------------------------ the writer

    def _run(self) -> None:
        while True:
            self._wake.wait(self._every)
            self._wake.clear()
            closing = self._closing
            self.flush()
            if closing:
                return

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            private_dir(self.path.parent)  # 0700, the database 0600 (state_paths)
            private_sqlite(self.path)
            self._db = _connect(self.path)
        return self._db

    def flush(self) -> None:
        """Write what was counted (the writer thread calls it every second)."""
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return
        try:
            with self._db_lock:
                db = self._open()
                with db:
                    db.executemany(_UPSERT, [(*row, *acc) for row, acc in batch.items()])
            self._failed = False
        except (sqlite3.Error, OSError) as exc:
            if not self._failed:
                log.error("cannot write usage to %s: %s (kept in memory, retried)", self.path, exc)
            self._failed = True
            with self._lock:  # put it back, merged with what came meanwhile
                for row, acc in batch.items():
                    cur = self._pending.setdefault(row, [0] * len(COUNTS))
                    for i in range(len(COUNTS)):
                        cur[i] += acc[i]

    def close(self) -> None:
        with self._lock:
            self._closing = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(30)
        self.flush()  # what came after the writer's last round (or with no writer at all)
        with self._db_lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None

    # ------------------------------------------------------------------ reading

    def query(self, *, key: str | None = None, model: str | None = None,
              since: str | None = None) -> list[dict[str, Any]]:
        """Rows ``{key, model, day, requests, prompt_tokens, completion_tokens, cached_tokens,
        queue_ms, limited, unavailable}``, ordered by day, key, model; flushed and pending
        counts together."""
        where, args = [], []
        for col, val, op in (("key", key, "="), ("model", model, "="), ("day", since, ">=")):
            if val is not None:
                where.append(f"{col} {op} ?")
                args.append(val)
        sql = f"SELECT key, model, day, {', '.join(COUNTS)} FROM usage"
        if where:
            sql += " WHERE " + " AND ".join(where)
        totals: dict[Row, list[int]] = {}
        if self.path.exists():
            with self._db_lock:
                for k, m, d, *counts in self._open().execute(sql, args):
                    totals[(k, m, d)] = list(counts)
        with self._lock:
            pending = list(self._pending.items())
        for (k, m, d), acc in pending:
            if (key is None or k == key) and (model is None or m == model) and (since is None or d >= since):
                cur = totals.setdefault((k, m, d), [0] * len(COUNTS))
                for i in range(len(COUNTS)):
                    cur[i] += acc[i]
        return [{"key": k, "model": m, "day": d, **dict(zip(COUNTS, counts))}
                for (k, m, d), counts in sorted(totals.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1]))]

    def day_tokens(self, key: str, day: str) -> int:
        """Prompt + completion tokens of ``key`` on ``day`` (seeds the tokens-per-day limit)."""
        try:
            return sum(r["prompt_tokens"] + r["completion_tokens"]
                       for r in self.query(key=key, since=day) if r["day"] == day)
        except (sqlite3.Error, OSError) as exc:
            log.warning("cannot read usage from %s: %s", self.path, exc)
            return 0
