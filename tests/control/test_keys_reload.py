"""The keys file while the router runs: revocation and rotation take effect at once
(requests in flight finish), a broken file keeps the old keys, SIGHUP re-reads it."""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
from pathlib import Path

import pytest
from support.harness import Harness, chat, wait_event
from support.keys import bearer, remove_key, rotate_key, write_keys_file


async def _start(harness: Harness, *, sighup: bool = False) -> tuple[Path, dict[str, str]]:
    secrets = await harness.serve({"a": {"path": str(harness.script("a", tokens=["t"] * 6, slow_delay_s=0.05))}},
                                  keys={"bob": {"scopes": ["infer"]}, "eve": {"scopes": ["infer"]}}, sighup=sighup)
    return harness.tmp / "keys.toml", secrets


def _replace(path: Path, text: str) -> None:
    """Write ``text`` as an editor that saves atomically does."""
    fd, tmp = tempfile.mkstemp(dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


async def test_a_removed_key_is_refused_at_once_and_its_stream_finishes(harness: Harness) -> None:
    path, secrets = await _start(harness)
    c = harness.client
    h = bearer(secrets["bob"])
    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "SLOW", stream=True), headers=h) as s:
        assert s.status_code == 200
        lines = s.aiter_lines()
        first = await anext(lines)
        assert first.startswith("data: ")
        remove_key(path, "bob")  # `corral keys rm bob`
        r = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
        assert r.status_code == 401  # the very next request
        rest = [line async for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in [first, *rest] if line.startswith("data: {")]
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch.get("choices"))
    # every token of the running stream arrived (a client behind gets several in one chunk)
    assert text == "t" * 6, text
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=bearer(secrets["eve"]))).status_code == 200


async def test_a_rotated_key_takes_the_new_secret_only(harness: Harness) -> None:
    path, secrets = await _start(harness)
    c = harness.client
    rotate_key(path, "bob", "sk-new-secret-for-bob-0123456789")
    assert (await c.get("/v1/models", headers=bearer(secrets["bob"]))).status_code == 401
    assert (await c.get("/v1/models", headers=bearer("sk-new-secret-for-bob-0123456789"))).status_code == 200


async def test_a_broken_keys_file_keeps_the_old_keys(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    path, secrets = await _start(harness)
    c = harness.client
    h = bearer(secrets["bob"])
    async with harness.plane.bus.subscribe() as q:
        _replace(path, path.read_text() + "\n[keys.mallory\nhash = ")  # a syntax error
        with caplog.at_level(logging.ERROR, logger="corral.keys"):
            assert (await c.get("/v1/models", headers=h)).status_code == 200  # the old keys stay
        ev = await wait_event(q, lambda e: e.name == "keys_reload_failed")
        assert "not valid TOML" in ev["reason"] and str(path) in ev["reason"]
        assert any("previous keys stay" in r.getMessage() for r in caplog.records)
        assert harness.plane.access.keys.last_error is not None
        # a file that parses but is wrong (an unknown scope) is refused the same way
        _replace(path, '[keys.x]\nhash = "sha256:' + "0" * 64 + '"\nscopes = ["root"]\n')
        assert (await c.get("/v1/models", headers=h)).status_code == 200
        ev = await wait_event(q, lambda e: e.name == "keys_reload_failed")
        assert "unknown scope 'root'" in ev["reason"]
        # fixed: the new keys count, and the event says what changed
        write_keys_file(path, bob={"scopes": ["infer"]}, carl={})
        assert (await c.get("/v1/models", headers=h)).status_code == 200
        ev = await wait_event(q, lambda e: e.name == "keys_reloaded")
        assert ev["added"] == ["carl"] and ev["removed"] == ["eve"] and ev["keys"] == 2
    assert (await c.get("/v1/models", headers=bearer(secrets["eve"]))).status_code == 401


async def test_sighup_reads_the_keys_file_again(harness: Harness) -> None:
    await _start(harness, sighup=True)
    async with harness.plane.bus.subscribe() as q:
        os.kill(os.getpid(), signal.SIGHUP)
        ev = await wait_event(q, lambda e: e.name == "keys_reloaded")
        assert ev["keys"] == 2 and ev["added"] == [] and ev["removed"] == []
        await wait_event(q, lambda e: e.name == "config_reloaded")  # the config too, as before


async def test_a_reloaded_config_can_name_another_keys_file(harness: Harness) -> None:
    _, secrets = await _start(harness)
    other = harness.tmp / "other-keys.toml"
    new = write_keys_file(other, zed={})
    cfg = harness.config({"a": {"path": str(harness.script("a"))}}, keys_file=str(other))
    await harness.plane.reload(cfg)
    c = harness.client
    assert (await c.get("/v1/models", headers=bearer(secrets["bob"]))).status_code == 401
    assert (await c.get("/v1/models", headers=bearer(new["zed"]))).status_code == 200
