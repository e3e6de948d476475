"""The hostile tester's file attacks (issue 33, part 6), replayed.

Each test undoes one attack: prompts and usage on disk readable by other users of the
machine (under the usual umask 022, in a state dir an older corral left 0755); a crafted
prompt-cache header that made the model fail to load, with a traceback in the 503; a slot
filename whose temporary names did not fit NAME_MAX (a 500 naming the state path); request
schemas whose descriptions name source files; `corral keys` run as root leaving its lock
file, or the keys file, to the wrong user; a key name with a trailing newline; a non-UTF-8
keys file.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.harness import Harness
from support.keys import bearer, write_keys_file

from cli.run import corral
from corral.state import cache_files
from corral.errors import ConfigError
from corral.config.keys_file import name_problem, read_keys


def test_a_key_name_with_a_trailing_newline_is_refused() -> None:
    assert name_problem("alice") is None
    assert name_problem("alice\n") is not None


def test_a_non_utf8_keys_file_is_a_config_error(tmp_path: Path) -> None:
    p = tmp_path / "keys.toml"
    p.write_bytes(b"[keys.a]\nhash = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_keys(p)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # what a service or a login shell has: files 0644, dirs 0755
    try:
        yield
    finally:
        os.umask(old)


PROMPT = "The door PIN is 4817. " + " ".join(
    f"Rule {i}: visitors sign in at desk {i % 4} and wear badge colour {('red', 'blue', 'green')[i % 3]}."
    for i in range(10)) + " Question: where do I sign in?"  # long enough for the prompt cache to keep


def _models(model_path: Path) -> dict[str, Any]:
    return {"m": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 1, "threads": 1}}


async def _start(h: Harness, model_path: Path, state: Path) -> dict[str, str]:
    secrets = await h.serve(_models(model_path), keys={"alice": {"scopes": ["infer", "manage"]}}, worker_command=None,
                            state_dir=str(state))
    return bearer(secrets["alice"])


def _open_to_others(root: Path) -> list[str]:
    """Every path under ``root`` (and root) that a user other than its owner may enter or read."""
    return [f"{p.relative_to(root.parent)} {stat.S_IMODE(p.lstat().st_mode):o}"
            for p in [root, *root.rglob("*")] if stat.S_IMODE(p.lstat().st_mode) & 0o077]


@pytest.mark.integration
async def test_what_the_server_keeps_is_its_owners_alone(harness: Harness, model_path: Path, umask_022: None) -> None:
    state = harness.tmp / "state"
    state.mkdir(mode=0o755)  # as an older corral left it
    (state / "old-notes").write_text("x")  # not corral's: left alone, but the dir around it closes
    os.chmod(state / "old-notes", 0o600)
    alice = await _start(harness, model_path, state)
    c = harness.client
    prompt = PROMPT
    r = await c.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}, headers=alice)
    assert r.status_code == 200, r.text  # usage.db
    r = await c.post("/v1/responses", json={"model": "m", "input": prompt, "max_output_tokens": 2}, headers=alice)
    assert r.status_code == 200, r.text  # responses.db
    r = await c.post("/slots/0?action=save", json={"filename": "desk.bin"}, headers=alice)
    assert r.status_code == 200, r.text  # a slot file and its sidecar
    r = await c.post("/models/unload", json={"model": "m"}, headers=alice)
    assert r.status_code == 200, r.text  # the worker wrote the prefix to the prompt cache as it stopped
    assert harness.plane is not None
    harness.plane.access.usage.flush()  # usage.db
    names = {p.name for p in state.rglob("*")}
    assert {"usage.db", "responses.db", "desk.bin", "prompt-cache"} <= names, names
    assert any(n.endswith(cache_files.SUFFIX) for n in names), names
    assert _open_to_others(state) == []


@pytest.mark.integration
async def test_a_slot_filename_fits_the_workers_temporary_names(harness: Harness, model_path: Path) -> None:
    alice = await _start(harness, model_path, harness.tmp / "state")
    c = harness.client
    r = await c.post("/v1/completions", json={"model": "m", "prompt": "Hello", "max_tokens": 1}, headers=alice)
    assert r.status_code == 200, r.text
    longest = "s" * 200  # its temporary names (".NAME.corral.PID.NS.tmp") still fit in 255 bytes
    r = await c.post("/slots/0?action=save", json={"filename": longest}, headers=alice)
    assert r.status_code == 200, r.text
    for name in ("s" * 201, "é" * 115):  # 230 bytes: the worker's temporary name did not fit (a 500)
        r = await c.post("/slots/0?action=save", json={"filename": name}, headers=alice)
        assert r.status_code == 400, r.text
        assert "200 bytes" in r.text and str(harness.tmp) not in r.text
    r = await c.post("/slots/0?action=restore", json={"filename": longest}, headers=alice)
    assert r.status_code == 200, r.text


def _crafted(real: bytes, meta_json: bytes) -> bytes:
    """A cache file with ``real``'s body under another header (the checksum no longer matters:
    the header is read first)."""
    n = struct.unpack("<I", real[8:12])[0]
    return real[:8] + struct.pack("<I", len(meta_json)) + meta_json + real[12 + n:]


def _headers(real: bytes) -> dict[str, bytes]:
    n = struct.unpack("<I", real[8:12])[0]
    meta = json.loads(real[12:12 + n])
    huge = json.dumps(meta).replace(f'"n_tokens": {meta["n_tokens"]}', '"n_tokens": 1e400').encode()
    many = json.dumps({**meta, "n_tokens": 1 << 60}).encode()
    negative = json.dumps({**meta, "state_bytes": -5}).encode()
    deep = b'{"v": 1, "key": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    return {"huge": huge, "many": many, "negative": negative, "deep": deep, "list": b"[1, 2]",
            "pos": json.dumps({**meta, "pos_min": meta["n_tokens"] + 1}).encode()}


def test_crafted_cache_headers_are_refused_not_raised(tmp_path: Path) -> None:
    real = cache_files.write_entry(tmp_path / "k", "key", "m", [1, 2, 3], 0, b"state")
    assert cache_files.read_header(real).tokens == (1, 2, 3)
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    for name, header in _headers(real.read_bytes()).items():
        bad = tmp_path / "k" / f"{name}{cache_files.SUFFIX}"
        bad.write_bytes(_crafted(real.read_bytes(), header))
        with pytest.raises(cache_files.CacheFileError) as caught:
            cache_files.read_header(bad)
        assert len(str(caught.value)) < 200, (name, str(caught.value)[:300])
    assert [type(x).__name__ for x in cache_files.scan(tmp_path / "k")].count("CacheFileError") == 6


@pytest.mark.integration
async def test_a_crafted_cache_file_is_dropped_and_the_model_loads(harness: Harness, model_path: Path) -> None:
    state = harness.tmp / "state"
    alice = await _start(harness, model_path, state)
    c = harness.client
    r = await c.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 1},
                     headers=alice)
    assert r.status_code == 200, r.text
    r = await c.post("/models/unload", json={"model": "m"}, headers=alice)
    assert r.status_code == 200, r.text
    (real,) = (state / "prompt-cache").rglob("*" + cache_files.SUFFIX)
    body = real.read_bytes()
    for name, header in _headers(body).items():
        (real.parent / f"{name}{cache_files.SUFFIX}").write_bytes(_crafted(body, header))
    r = await c.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 1},
                     headers=alice)
    assert r.status_code == 200, r.text  # it loaded (a failed load was a 503 with a traceback)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the good entry still served
    assert sorted(p.name for p in real.parent.iterdir()) == [real.name]  # the crafted ones dropped


async def test_a_failed_load_answers_its_reason_without_the_workers_log(harness: Harness, model_path: Path) -> None:
    crash = [sys.executable, "-c", "import corral.worker.not_installed"]  # a broken install: a traceback, exit 1
    await harness.serve(_models(model_path), worker_command=crash,
                        state_dir=str(harness.tmp / "state"))
    c = harness.client
    r = await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 503, r.text
    text = r.json()["error"]["message"]
    assert "m failed" in text
    assert "Traceback" not in text and "not_installed" not in text and ".py" not in text, text
    assert harness.plane is not None
    assert "Traceback" in (harness.tmp / "logs").joinpath(next(iter(os.listdir(harness.tmp / "logs")))).read_text()


async def test_no_request_schema_names_a_source_file(harness: Harness, model_path: Path) -> None:
    await harness.serve(_models(model_path))
    c = harness.client
    r = await c.get("/openapi.json")
    assert r.status_code == 200
    doc = r.text
    assert '"paths"' in doc and '"components"' in doc
    found = sorted(set(re.findall(r"[\w/]+\.py\b|corral\.[a-z_]+\.[a-z_]+", doc)))
    assert found == [], found


def test_keys_commands_as_root_keep_the_files_owner(tmp_path: Path, umask_022: None) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test runs as root (as CI does): `corral keys` run by root for a service user")
    path = tmp_path / "keys.toml"
    kf = ("--keys-file", str(path))
    r = corral("keys", "add", "alice", *kf)
    assert r.returncode == 0, r.stderr
    r = corral("keys", "add", "bob", *kf)
    assert r.returncode == 0, r.stderr
    service = (4321, 4322)  # the server's user and group
    for p in (path, path.with_name(path.name + ".lock")):
        os.chown(p, *service)
    os.chmod(path, 0o640)
    os.unlink(path.with_name(path.name + ".lock"))  # a new lock file, made by root this time
    r = corral("keys", "rm", "bob", *kf)
    assert r.returncode == 0, r.stderr
    assert set(read_keys(path)) == {"alice"}
    st, lock = path.stat(), path.with_name(path.name + ".lock").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (*service, 0o640)
    assert (lock.st_uid, lock.st_gid, stat.S_IMODE(lock.st_mode)) == (*service, 0o600)


def test_the_server_rereads_a_keys_file_it_could_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`corral keys rm` as root once left the file root's: the server (another user) could not
    read it and kept the removed key; after a `chown` back it kept it until SIGHUP. Being root
    here, "cannot read" is the file system's answer played by ``read_keys`` for a file that is
    not the server's user's (uid 0 here); the ring must notice the chown back, and retry."""
    from corral.control.keys import ring as keyring
    from corral.events import EventBus

    path = tmp_path / "keys.toml"
    write_keys_file(path, alice={}, bob={})
    real = keyring.read_keys

    def as_the_server(p: Path) -> dict[str, Any]:
        if p.stat().st_uid != 0:
            raise ConfigError(f"{p}: cannot read the keys file: Permission denied")
        return real(p)

    monkeypatch.setattr(keyring, "read_keys", as_the_server)
    now = [1000.0]
    monkeypatch.setattr(keyring.time, "monotonic", lambda: now[0])
    ring = keyring.KeyRing(lambda: path, lambda: None, EventBus())
    assert ring.names() == ["alice", "bob"]
    text = path.read_text()
    write_keys_file(path, alice={})  # bob removed...
    os.chown(path, 4321, 4321)  # ...and the file left to another user
    ring.refresh()
    assert ring.names() == ["alice", "bob"] and ring.last_error is not None  # the old keys stay meanwhile
    os.chown(path, 0, 0)  # the owner put back: nothing else changes
    ring.refresh()
    assert ring.names() == ["alice"] and ring.last_error is None
    os.chown(path, 4321, 4321)
    path.write_text(text)  # bob back, unreadable, then readable with the stamp the ring last saw
    ring.refresh()
    assert ring.names() == ["alice"] and ring.last_error is not None
    monkeypatch.setattr(keyring, "read_keys", real)  # readable now, and nothing about the file changes
    ring.refresh()
    assert ring.names() == ["alice"]  # not yet: a failed read is retried every RETRY_S
    now[0] += keyring.RETRY_S
    ring.refresh()
    assert ring.names() == ["alice", "bob"]
