"""Usage per key, model and day: counted off the request path, kept in SQLite, served by
GET /usage, labelled in the metrics."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest
from support.harness import Harness, _until, chat
from support.keys import bearer

from corral.control.keys.limits import utc_day
from corral.control.keys.usage import UsageBook, state_dir

MSG = {"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "one two three"}]}


async def _start(harness: Harness, **server: object) -> dict[str, str]:
    models = {"a": {"path": str(harness.script("a"))}, "b": {"path": str(harness.script("b"))},
              "e": {"path": str(harness.script("e")), "embedding": True}}
    return await harness.serve(models, keys={"alice": {}, "bob": {}, "root": {"scopes": ["admin"]}},
                               state_dir=str(harness.tmp / "state"), **server)


_OLD = ("key", "model", "day", "requests", "prompt_tokens", "completion_tokens")


def _old(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The rows' original columns (queue_ms is what it is; the new counts are tested below)."""
    return [{k: r[k] for k in _OLD} for r in rows]


def _rows(db: Path) -> list[tuple[object, ...]]:
    """What the database holds, read as another process would (no table yet: nothing)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            return list(conn.execute("SELECT key, model, day, requests, prompt_tokens, completion_tokens "
                                     "FROM usage ORDER BY key, model, day"))
        except sqlite3.OperationalError:
            return []


async def test_usage_per_key_and_model_in_every_dialect(harness: Harness) -> None:
    secrets = await _start(harness)
    c = harness.client
    a, b, root = bearer(secrets["alice"]), bearer(secrets["bob"]), bearer(secrets["root"])
    assert (await c.post("/v1/chat/completions", json=chat("a", "one two"), headers=a)).status_code == 200
    assert (await c.post("/v1/messages", json=MSG, headers=a)).status_code == 200
    r = await c.post("/api/generate", json={"model": "b", "prompt": "x y z w", "stream": False}, headers=a)
    assert r.status_code == 200
    # a stream, and n=3 choices: one request each, every choice's tokens
    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "hi", stream=True), headers=b) as s:
        assert [line async for line in s.aiter_lines() if line][-1] == "data: [DONE]"
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "hi", "n": 3}, headers=b)
    assert r.status_code == 200
    assert (await c.post("/v1/embeddings", json={"model": "e", "input": "p q"}, headers=b)).status_code == 200
    today = utc_day()
    want = [{"key": "alice", "model": "a", "day": today, "requests": 2, "prompt_tokens": 2 + 3,
             "completion_tokens": 4 + 4},
            {"key": "alice", "model": "b", "day": today, "requests": 1, "prompt_tokens": 4, "completion_tokens": 4},
            {"key": "bob", "model": "a", "day": today, "requests": 2, "prompt_tokens": 1 + 3,
             "completion_tokens": 4 + 12},
            {"key": "bob", "model": "e", "day": today, "requests": 1, "prompt_tokens": 2, "completion_tokens": 0}]
    r = await c.get("/usage", headers=root)
    assert r.status_code == 200 and _old(r.json()["data"]) == want
    assert all(row["limited"] == row["unavailable"] == row["cached_tokens"] == 0 and row["queue_ms"] >= 0
               for row in r.json()["data"])
    # a key sees its own usage only
    assert _old((await c.get("/usage", headers=a)).json()["data"]) == want[:2]
    r = await c.get("/usage", params={"key": "bob"}, headers=a)
    assert r.status_code == 403
    # filters
    assert _old((await c.get("/usage", params={"key": "bob"}, headers=root)).json()["data"]) == want[2:]
    assert _old((await c.get("/usage", params={"model": "a"}, headers=root)).json()["data"]) == [want[0], want[2]]
    assert (await c.get("/usage", params={"since": "2999-01-01"}, headers=root)).json()["data"] == []
    assert _old((await c.get("/usage", params={"since": today}, headers=root)).json()["data"]) == want
    r = await c.get("/usage", params={"since": "yesterday"}, headers=root)
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"
    # kept: flushed to the database within a second or so
    db = harness.tmp / "state" / "usage.db"
    await _until(lambda: db.exists() and len(_rows(db)) == 4, timeout=10)
    assert _rows(db) == [tuple(w.values()) for w in want]
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    # the metrics, labelled by key
    text = (await c.get("/metrics", headers=root)).text
    assert 'corral_key_requests_total{key="alice",model="a"} 2.0' in text
    assert 'corral_key_completion_tokens_total{key="bob",model="a"} 16.0' in text


async def test_without_keys_usage_is_anonymous(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a"))}}, state_dir=str(harness.tmp / "state"))
    await harness.start(cfg)
    c = harness.client
    assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200
    r = await c.get("/usage")
    assert _old(r.json()["data"]) == [{"key": "-", "model": "a", "day": utc_day(), "requests": 1,
                                       "prompt_tokens": 1, "completion_tokens": 4}]


async def test_the_api_key_counts_as_api_key(harness: Harness) -> None:
    await _start(harness, api_key="s3cret")
    c = harness.client
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=bearer("s3cret"))).status_code == 200
    rows = (await c.get("/usage", headers=bearer("s3cret"))).json()["data"]
    assert [(r["key"], r["requests"]) for r in rows] == [("api_key", 1)]


def test_the_book_flushes_in_batches_off_the_caller(tmp_path: Path) -> None:
    book = UsageBook(tmp_path / "st", flush_every_s=3600)  # the writer waits: nothing written yet
    threads = [threading.Thread(target=lambda: [book.record("k", "m", requests=1, prompt_tokens=2,
                                                            completion_tokens=3) for _ in range(500)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not (tmp_path / "st" / "usage.db").exists()
    assert book.query() == [{"key": "k", "model": "m", "day": utc_day(), "requests": 2000,
                             "prompt_tokens": 4000, "completion_tokens": 6000, "cached_tokens": 0, "queue_ms": 0,
                             "limited": 0, "unavailable": 0}]
    book.record("k", "m", requests=1, prompt_tokens=0, completion_tokens=0, day="2020-01-01")
    book.close()  # flushes what is left
    assert _rows(tmp_path / "st" / "usage.db") == [("k", "m", "2020-01-01", 1, 0, 0),
                                                   ("k", "m", utc_day(), 2000, 4000, 6000)]
    again = UsageBook(tmp_path / "st")
    assert again.day_tokens("k", utc_day()) == 10000
    assert [r["day"] for r in again.query(since="2021-01-01")] == [utc_day()]
    again.close()


def test_a_database_of_an_older_corral_gets_the_new_counts(tmp_path: Path) -> None:
    (tmp_path / "st").mkdir()
    with contextlib.closing(sqlite3.connect(tmp_path / "st" / "usage.db")) as conn:
        conn.execute("CREATE TABLE usage (key TEXT NOT NULL, model TEXT NOT NULL, day TEXT NOT NULL, "
                     "requests INTEGER NOT NULL DEFAULT 0, prompt_tokens INTEGER NOT NULL DEFAULT 0, "
                     "completion_tokens INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (key, model, day))")
        conn.execute("INSERT INTO usage VALUES ('k', 'm', '2020-01-01', 3, 4, 5)")
        conn.commit()
    book = UsageBook(tmp_path / "st")
    book.record("k", "m", cached_tokens=7, queue_ms=250, limited=2, unavailable=1, day="2020-01-01")
    book.close()
    again = UsageBook(tmp_path / "st")
    assert again.query() == [{"key": "k", "model": "m", "day": "2020-01-01", "requests": 3, "prompt_tokens": 4,
                              "completion_tokens": 5, "cached_tokens": 7, "queue_ms": 250, "limited": 2,
                              "unavailable": 1}]
    again.close()


def test_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CORRAL_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir(None) == tmp_path / "xdg" / "corral"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state_dir(None) == Path.home() / ".local" / "state" / "corral"
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "env"))
    assert state_dir(None) == tmp_path / "env"
    assert state_dir(tmp_path / "cfg") == tmp_path / "cfg"  # [server] state_dir comes first


def test_tokens_per_day_count_what_the_database_kept(tmp_path: Path) -> None:
    """After a restart the tokens-per-day limit starts from the day's usage on disk."""
    from corral.control.keys.limits import Limiter
    from corral.errors import RateLimited
    from corral.config.keys_file import KeySpec

    book = UsageBook(tmp_path)
    book.record("k", "m", requests=1, prompt_tokens=60, completion_tokens=40)
    book.record("k", "m", requests=1, prompt_tokens=999, completion_tokens=0, day="2020-01-01")
    book.close()
    again = UsageBook(tmp_path)
    try:
        lim = Limiter(day_tokens=again.day_tokens)
        lim.admit("k", KeySpec(hash="", tpd=101))  # 100 used today: one more request may start
        lim.settle(lim.reserve("k", KeySpec(hash="", tpd=101), 5), 1)  # 1 of the 1 left
        with pytest.raises(RateLimited, match="per day"):
            lim.admit("k", KeySpec(hash="", tpd=101))
        lim.admit("other", KeySpec(hash="", tpd=101))
    finally:
        again.close()
