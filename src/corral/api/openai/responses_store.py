"""The stored responses of ``POST /v1/responses``: one SQLite file beside usage.db.

``STATE_DIR/responses.db`` (mode 0600: it holds prompts and answers) has one row per
response created with ``store: true`` (OpenAI's default) or ``background: true``: its id,
the name of the key that made it (``-`` without keys), the response object as
``GET /v1/responses/{id}`` returns it, and the conversation up to and including its answer
(OpenAI chat messages), which ``previous_response_id`` continues. A response is visible to
the key that made it only: any other key gets the same 404 as for an id that never
existed, on GET, DELETE, cancel and ``previous_response_id`` alike.

Bounded in bytes (``max_bytes``, the JSON of all rows; the oldest go first) and in age
(``max_age_s``, dropped when read or written after that). Rows survive a restart; a
background response that was still running when the server stopped is restored as
``failed`` (its generation is gone). Calls run in a thread (``asyncio.to_thread``), one
at a time on one connection.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from corral.errors import NotFound
from corral.state.paths import private_dir, private_sqlite

__all__ = ["RESPONSES_DB", "ResponseStore", "StoredResponse"]

RESPONSES_DB = "responses.db"
MAX_BYTES = 256 * 1024 * 1024
MAX_AGE_S = 30 * 86400

_SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created REAL NOT NULL, size INTEGER NOT NULL,
    response TEXT NOT NULL, conversation TEXT NOT NULL)"""


class StoredResponse:
    __slots__ = ("id", "owner", "response", "conversation")

    def __init__(self, rid: str, owner: str, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self.id = rid
        self.owner = owner
        self.response = response
        self.conversation = conversation


def not_found(rid: str, param: str | None = None) -> NotFound:
    return NotFound(f"no stored response {rid!r} for this key (responses are kept for the key that made them, "
                    "when created with store=true, up to a size and age limit)", param=param)


class ResponseStore:
    def __init__(self, directory: Path, max_bytes: int = MAX_BYTES, max_age_s: float = MAX_AGE_S) -> None:
        self.path = directory / RESPONSES_DB
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._closed = False

    def _open(self) -> sqlite3.Connection:
        if self._closed:
            raise sqlite3.ProgrammingError("the response store is closed")
        if self._db is None:
            private_dir(self.path.parent)  # 0700, the database 0600 (state_paths)
            private_sqlite(self.path)
            db = sqlite3.connect(self.path, timeout=10, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            with db:  # what a stopped server left running cannot finish any more
                for rid, text in db.execute("SELECT id, response FROM responses").fetchall():
                    resp = json.loads(text)
                    if resp.get("status") in ("queued", "in_progress"):
                        resp["status"] = "failed"
                        resp["error"] = {"code": "server_error", "message": "the server stopped while it ran"}
                        db.execute("UPDATE responses SET response = ? WHERE id = ?", (json.dumps(resp), rid))
            self._db = db
        return self._db

    # ------------------------------------------------------------------ blocking calls (in a thread)

    def _put(self, item: StoredResponse) -> None:
        response, conversation = json.dumps(item.response), json.dumps(item.conversation)
        size = len(response) + len(conversation)
        with self._lock:
            db = self._open()
            with db:
                if size > self.max_bytes:
                    db.execute("DELETE FROM responses WHERE id = ?", (item.id,))
                    return
                db.execute("INSERT INTO responses VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                           "size = excluded.size, response = excluded.response, "
                           "conversation = excluded.conversation",
                           (item.id, item.owner, time.time(), size, response, conversation))
                self._trim(db)

    def _trim(self, db: sqlite3.Connection) -> None:
        db.execute("DELETE FROM responses WHERE created < ?", (time.time() - self.max_age_s,))
        (total,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()
        if total > self.max_bytes:  # the oldest first, until the rest fits
            over = total - self.max_bytes
            gone = 0
            for rid, size in db.execute("SELECT id, size FROM responses ORDER BY created").fetchall():
                if gone >= over:
                    break
                db.execute("DELETE FROM responses WHERE id = ?", (rid,))
                gone += size

    def _get(self, rid: str, owner: str) -> StoredResponse | None:
        with self._lock:
            row = self._open().execute(
                "SELECT response, conversation FROM responses WHERE id = ? AND owner = ? AND created >= ?",
                (rid, owner, time.time() - self.max_age_s)).fetchone()
        if row is None:
            return None
        return StoredResponse(rid, owner, json.loads(row[0]), json.loads(row[1]))

    def _delete(self, rid: str, owner: str) -> bool:
        with self._lock:
            db = self._open()
            with db:
                return db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (rid, owner)).rowcount > 0

    # ------------------------------------------------------------------ the API

    async def put(self, item: StoredResponse) -> None:
        await asyncio.to_thread(self._put, item)

    async def get(self, rid: str, owner: str, param: str | None = None) -> StoredResponse:
        """The response ``rid`` of ``owner``; 404 when there is none (or it is another key's)."""
        item = await asyncio.to_thread(self._get, rid, owner)
        if item is None:
            raise not_found(rid, param)
        return item

    async def delete(self, rid: str, owner: str) -> None:
        if not await asyncio.to_thread(self._delete, rid, owner):
            raise not_found(rid)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._db is not None:
                self._db.close()
                self._db = None
