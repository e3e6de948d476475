"""Streams that outlive their client (X-Conversation-Id, GET/DELETE /v1/stream), with a real
router, a real worker and the embedded model, greedy: the client leaves at the first token,
the generation goes on, and a replay from any event gives what a client that stayed got."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.config.file import CorralConfig
from corral.events import Event
from support.harness import Harness, wait_event
from support.keys import bearer, write_keys_file

pytestmark = pytest.mark.integration

BODY = {"model": "m", "prompt": "Once upon a time", "stream": True, "max_tokens": 160,
        "ignore_eos": True, "temperature": 0}


def _config(harness: Harness, model_path: Path, keys: Path, **server: Any) -> CorralConfig:
    models = {"m": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1}}
    return harness.config(models, worker_command=None, keys_file=str(keys), **server)


async def _start(harness: Harness, model_path: Path, **server: Any) -> dict[str, str]:
    keys = harness.tmp / "keys.toml"
    secrets = write_keys_file(keys, alice={"scopes": ["infer"]}, bob={"scopes": ["infer"]},
                              root={"scopes": ["admin"]})
    cfg = _config(harness, model_path, keys, **server)
    await harness.start(cfg, loader=lambda: _config(harness, model_path, keys, **server))
    return secrets


def _events(lines: list[str]) -> list[str]:
    return [line[6:] for line in lines if line.startswith("data: ")]


def _text(events: list[str]) -> str:
    return "".join(json.loads(e)["choices"][0]["text"] for e in events if e != "[DONE]" and json.loads(e)["choices"])


async def _leave_at_first_token(c: httpx.AsyncClient, secret: str, conv_id: str, **body: Any) -> httpx.Response:
    """Start a conversation and close the connection once its first token came."""
    headers = {**bearer(secret), "X-Conversation-Id": conv_id}
    async with c.stream("POST", "/v1/completions", json={**BODY, **body}, headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["x-conversation-id"] == conv_id
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and _text([line[6:]]):
                break
    return resp


async def _replay(c: httpx.AsyncClient, secret: str, conv_id: str, start: int = 0) -> list[str]:
    async with c.stream("GET", "/v1/stream", params={"conv_id": conv_id, "from": start},
                        headers=bearer(secret)) as resp:
        assert resp.status_code == 200, await resp.aread()
        return _events([line async for line in resp.aiter_lines()])


async def _uninterrupted(c: httpx.AsyncClient, secret: str) -> list[str]:
    async with c.stream("POST", "/v1/completions", json=BODY, headers=bearer(secret)) as resp:
        assert resp.status_code == 200
        return _events([line async for line in resp.aiter_lines()])


def _ended(conv_id: str) -> Any:
    return lambda e: e["event"] == "conversation_ended" and e["conv_id"] == conv_id


async def test_a_conversation_outlives_its_client_and_replays_from_any_event(harness: Harness,
                                                                           model_path: Path) -> None:
    secrets = await _start(harness, model_path)
    c = harness.client
    plane = harness.plane
    async with plane.bus.subscribe() as q:
        await _leave_at_first_token(c, secrets["alice"], "c-1")
        assert plane.conversations.get("alice", "c-1").running  # the client left before the end
        ended: Event = await wait_event(q, _ended("c-1"), timeout=120)
    assert ended["status"] == "finished" and ended["key"] == "alice"
    replayed = await _replay(c, secrets["alice"], "c-1")
    stayed = await _uninterrupted(c, secrets["alice"])
    assert replayed[-1] == "[DONE]"
    assert _text(replayed) == _text(stayed) and len(_text(stayed)) > 100
    assert await _replay(c, secrets["alice"], "c-1", 5) == replayed[5:]
    assert await _replay(c, secrets["alice"], "c-1", len(replayed)) == []
    # another key: as if it did not exist, reading or stopping
    for method in ("GET", "DELETE"):
        other = await c.request(method, "/v1/stream", params={"conv_id": "c-1"}, headers=bearer(secrets["bob"]))
        unknown = await c.request(method, "/v1/stream", params={"conv_id": "c-2"}, headers=bearer(secrets["alice"]))
        assert other.status_code == unknown.status_code == 404
        assert other.json()["error"]["message"].replace("c-1", "X") == unknown.json()["error"]["message"].replace("c-2", "X")
    bad = await c.get("/v1/stream", params={"conv_id": "c-1", "from": "-1"}, headers=bearer(secrets["alice"]))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "from"
    bad = await c.post("/v1/completions", json=BODY, headers={**bearer(secrets["alice"]), "X-Conversation-Id": "a b"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Conversation-Id"


async def test_delete_stops_the_generation_and_frees_the_slot(harness: Harness, model_path: Path) -> None:
    secrets = await _start(harness, model_path)
    c = harness.client
    plane = harness.plane
    await _leave_at_first_token(c, secrets["alice"], "long", max_tokens=800)
    assert plane.pools["m"].inflight == 1  # still generating for nobody
    cross = await c.delete("/v1/stream", params={"conv_id": "long"},
                           headers={**bearer(secrets["alice"]), "Origin": "http://evil.example"})
    assert cross.status_code == 403  # a cross-site page cannot stop it
    assert plane.conversations.get("alice", "long").running
    r = await c.delete("/v1/stream", params={"conv_id": "long"}, headers=bearer(secrets["alice"]))
    assert r.status_code == 200 and r.json()["status"] == "stopped"
    assert plane.pools["m"].inflight == 0  # the slot is free once DELETE answers
    slots = (await c.get("/slots", params={"model": "m"}, headers=bearer(secrets["root"]))).json()
    assert not any(s["is_processing"] for s in slots)
    kept = await _replay(c, secrets["alice"], "long")  # what it made before the stop stays readable
    assert kept and "[DONE]" not in kept and len(kept) < 800


async def test_the_per_key_bounds_refuse_or_stop_what_is_over(harness: Harness, model_path: Path) -> None:
    secrets = await _start(harness, model_path, max_conversations_per_key=1, conversation_bytes_per_key="6KB")
    c = harness.client
    plane = harness.plane
    async with plane.bus.subscribe() as q:
        await _leave_at_first_token(c, secrets["alice"], "first", max_tokens=800)
        r = await c.post("/v1/completions", json=BODY, headers={**bearer(secrets["alice"]), "X-Conversation-Id": "second"})
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "rate_limit_exceeded" and "max_conversations_per_key" in r.text
        # 6 KB of events is far less than 800 tokens' chunks: the generation is stopped there
        ended = await wait_event(q, _ended("first"), timeout=120)
    assert ended["status"] == "too_large" and ended["bytes"] <= 6000
    assert plane.pools["m"].inflight == 0
    events = await _replay(c, secrets["alice"], "first")
    assert json.loads(events[-2])["error"]["code"] == "conversation_too_large" and events[-1] == "[DONE]"
    # the finished one is dropped to make room for the next
    await _leave_at_first_token(c, secrets["alice"], "second", max_tokens=4)
    r = await c.get("/v1/stream", params={"conv_id": "first"}, headers=bearer(secrets["alice"]))
    assert r.status_code == 404


async def test_a_conversation_is_kept_across_a_config_reload(harness: Harness, model_path: Path) -> None:
    secrets = await _start(harness, model_path)
    c = harness.client
    plane = harness.plane
    async with plane.bus.subscribe() as q:
        await _leave_at_first_token(c, secrets["alice"], "kept")
        r = await c.post("/models/reload", headers=bearer(secrets["root"]))
        assert r.status_code == 200 and "m" not in r.json()["removed"] + r.json().get("restarted", [])
        ended = await wait_event(q, _ended("kept"), timeout=120)
    assert ended["status"] == "finished"
    replayed = await _replay(c, secrets["alice"], "kept")
    assert _text(replayed) == _text(await _uninterrupted(c, secrets["alice"]))
