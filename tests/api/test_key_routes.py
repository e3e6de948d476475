"""Keys for an admin over HTTP (api/manage/keys.py): list without secrets, create with the
secret shown once, revoke (refused from the next request on), who is running and queued now;
an infer key sees neither the keys nor another key's usage. 429s and 503s in the usage."""

from __future__ import annotations

import asyncio

from support.harness import Harness, chat
from support.keys import bearer

from corral.config.keys_file import read_keys


KEYS = {"alice": {"rpm": 1}, "root": {"scopes": ["admin"]}}


async def test_create_use_list_and_revoke_a_key(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS, state_dir=str(harness.tmp / "state"))
    c = harness.client
    root = bearer(secrets["root"])
    r = await c.post("/keys", json={"name": "carol", "scopes": ["infer"], "models": ["a"], "tpm": 5000}, headers=root)
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    assert secret.startswith("crl_") and r.json()["prefix"] == secret[:8] and r.json()["tpm"] == 5000
    assert "hash" not in r.json()
    assert secret not in (harness.tmp / "keys.toml").read_text()  # the file holds its hash only
    carol = bearer(secret)
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=carol)).status_code == 200
    listed = await c.get("/keys", headers=root)
    assert listed.status_code == 200
    rows = {k["name"]: k for k in listed.json()["data"]}
    assert set(rows) == {"alice", "carol", "root"}
    assert rows["carol"]["models"] == ["a"] and rows["carol"]["scopes"] == ["infer"]
    assert rows["carol"]["last_used"] is not None and rows["alice"]["last_used"] is None
    assert all("secret" not in k and "hash" not in k for k in listed.json()["data"])
    assert secret not in listed.text
    # the same name again: 409; a bad one: 400; nothing written
    assert (await c.post("/keys", json={"name": "carol"}, headers=root)).status_code == 409
    for bad in ({"name": "api_key"}, {"name": "a b"}, {"name": "x", "scopes": ["god"]}, {"name": "x", "rpm": 0},
                {"name": "x", "extra": 1}, {"name": "x" * 65}):
        assert (await c.post("/keys", json=bad, headers=root)).status_code == 400, bad
    assert set(read_keys(harness.tmp / "keys.toml")) == {"alice", "carol", "root"}
    # revoked: refused from the next request on
    assert (await c.delete("/keys/carol", headers=root)).status_code == 200
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=carol)).status_code == 401
    assert (await c.delete("/keys/carol", headers=root)).status_code == 404


async def test_an_infer_key_sees_only_its_own(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS, state_dir=str(harness.tmp / "state"))
    c = harness.client
    alice = bearer(secrets["alice"])
    assert (await c.get("/keys", headers=alice)).status_code == 403
    assert (await c.post("/keys", json={"name": "mallory", "scopes": ["admin"]}, headers=alice)).status_code == 403
    assert (await c.delete("/keys/root", headers=alice)).status_code == 403
    assert (await c.get("/usage", params={"key": "root"}, headers=alice)).status_code == 403
    assert (await c.get("/usage/now", headers=alice)).status_code == 200
    assert "root" in read_keys(harness.tmp / "keys.toml")


async def test_429s_count_in_the_usage_and_who_runs_now(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS, state_dir=str(harness.tmp / "state"))
    c = harness.client
    alice, root = bearer(secrets["alice"]), bearer(secrets["root"])
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=alice)).status_code == 200
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=alice)).status_code == 429  # rpm 1
    rows = (await c.get("/usage", params={"key": "alice"}, headers=root)).json()["data"]
    assert sum(r["limited"] for r in rows) == 1 and sum(r["requests"] for r in rows) == 1
    # a request of root's that runs until its client leaves: running now, per key and model
    task = asyncio.create_task(c.post("/v1/chat/completions", json=chat("a", "FOREVER"), headers=root))
    now: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not any(r["key"] == "root" and r["running"] == 1 for r in now):
        assert loop.time() < deadline, now
        now = (await c.get("/usage/now", headers=root)).json()["data"]
    assert {"key": "root", "model": "a", "running": 1, "queued": 0} in now
    assert (await c.get("/usage/now", headers=alice)).json()["data"] == []  # not root's
    task.cancel()
    # in /metrics too: the queue time per key and model
    text = (await c.get("/metrics", headers=root)).text
    assert 'corral_key_queue_seconds_total{key="alice",model="a"}' in text
    assert 'corral_rate_limited_total{key="alice",kind="requests"} 1.0' in text
