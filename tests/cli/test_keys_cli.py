"""`corral keys add | ls | rm | rotate` and `corral usage`, as a person (or a script) runs them,
against a real `corral serve` over fake workers."""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reliability.server import RouterProcess
from support.harness import FAKE, chat
from support.keys import bearer

from cli.run import corral
from corral.config.keys_file import read_keys


def _secret(out: str) -> str:
    """The secret: alone on the last line of the output."""
    last = out.rstrip("\n").splitlines()[-1]
    assert last.startswith("crl_") and " " not in last and len(last) > 40
    return last


def test_keys_add_ls_rotate_rm(tmp_path: Path) -> None:
    path = tmp_path / "k" / "keys.toml"
    kf = ["--keys-file", str(path)]
    r = corral("keys", "add", "alice", *kf, "--scopes", "infer,manage", "--models", "gemma-*", "--models", "qwen3",
               "--rpm", "60", "--tpm", "1000", "--concurrency", "2", "--weight", "2.5", "--max-priority", "3")
    assert r.returncode == 0, r.stderr
    alice = _secret(r.stdout)
    assert alice not in path.read_text()  # only its hash is kept
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    spec = read_keys(path)["alice"]
    assert (spec.scopes, spec.models, spec.rpm, spec.tpm, spec.concurrency, spec.weight, spec.max_priority) == \
        (("infer", "manage"), ("gemma-*", "qwen3"), 60, 1000, 2, 2.5, 3)
    r = corral("keys", "add", "bob", *kf)
    bob = _secret(r.stdout)
    assert read_keys(path)["bob"].scopes == ("infer",)
    # ls: a table, and JSON; never a secret
    r = corral("keys", "ls", *kf)
    assert r.returncode == 0 and "alice" in r.stdout and "bob" in r.stdout and "infer,manage" in r.stdout
    assert alice not in r.stdout and bob not in r.stdout and alice[:8] in r.stdout
    listed = json.loads(corral("keys", "ls", *kf, "--json").stdout)
    assert [k["name"] for k in listed] == ["alice", "bob"] and listed[0]["rpm"] == 60
    # rotate: a new secret, the same settings
    r = corral("keys", "rotate", "alice", *kf)
    new = _secret(r.stdout)
    assert new != alice and read_keys(path)["alice"].rpm == 60
    # rm; and what cannot be done says so, with exit 1 and the file unchanged
    assert corral("keys", "rm", "bob", *kf).returncode == 0
    assert list(read_keys(path)) == ["alice"]
    before = path.read_bytes()
    for args, words in ((["rm", "bob"], "no key 'bob'"), (["rotate", "nobody"], "no key 'nobody'"),
                        (["add", "alice"], "already exists"), (["add", "api_key"], "reserved"),
                        (["add", "x y"], "invalid key name"), (["add", "x", "--scopes", "root"], "not a scope"),
                        (["add", "x", "--weight", "0"], "--weight")):
        r = corral("keys", *args, *kf)
        assert r.returncode != 0 and words in r.stderr + r.stdout, (args, r.stderr)
        assert "Traceback" not in r.stderr
    assert path.read_bytes() == before
    r = corral("keys", "ls")
    assert r.returncode == 1 and "--keys-file" in r.stderr
    r = corral("keys", "ls", env={"CORRAL_KEYS_FILE": str(path)})
    assert r.returncode == 0 and "alice" in r.stdout
    # a broken file is reported, not overwritten
    path.write_text("[keys.x\n")
    r = corral("keys", "add", "y", *kf)
    assert r.returncode == 1 and "not valid TOML" in r.stderr and path.read_text() == "[keys.x\n"
    assert not list(path.parent.glob(".keys.toml.*.tmp"))  # no temporary file left behind


@pytest.fixture
def router(tmp_path: Path) -> Iterator[RouterProcess]:
    script = tmp_path / "a.json"
    script.write_text("{}")
    proc = RouterProcess(tmp_path, {"a": {"path": str(script)}}, worker_command=[sys.executable, str(FAKE)],
                         keys_file=str(tmp_path / "keys.toml"), state_dir=str(tmp_path / "state"))
    yield proc.start()
    proc.stop()


def test_keys_made_by_the_cli_work_on_a_running_server_and_usage_shows_them(
        tmp_path: Path, router: RouterProcess) -> None:
    kf = ["--keys-file", str(tmp_path / "keys.toml")]
    url = router.base_url
    alice = _secret(corral("keys", "add", "alice", *kf, "--models", "a").stdout)
    root = _secret(corral("keys", "add", "root", *kf, "--scopes", "admin").stdout)
    assert httpx.post(f"{url}/v1/chat/completions", json=chat("a"), headers=bearer(alice)).status_code == 200
    assert httpx.post(f"{url}/v1/chat/completions", json=chat("a"), headers=bearer(alice)).status_code == 200
    r = corral("usage", "--host", url, "--json", env={"CORRAL_API_KEY": root})
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)
    assert (row["key"], row["model"], row["requests"], row["completion_tokens"]) == ("alice", "a", 2, 8)
    r = corral("usage", "--host", url, env={"CORRAL_API_KEY": root})
    assert r.returncode == 0 and "alice" in r.stdout and "COMPLETION TOKENS" in r.stdout
    lines = [line for line in r.stdout.splitlines() if "alice" in line]
    assert lines and lines[0].replace("│", " ").split()[3:6] == ["2", "2", "8"]  # requests, prompt, completion
    assert json.loads(corral("usage", "--host", url, "--json", "--key", "nobody",
                             env={"CORRAL_API_KEY": root}).stdout) == []
    r = corral("usage", "--host", url, "--now", env={"CORRAL_API_KEY": root})
    assert r.returncode == 0 and "nobody is running or queued now" in r.stdout, r.stderr
    # rotated: the old secret is refused by the running server at once
    new = _secret(corral("keys", "rotate", "alice", *kf).stdout)
    assert httpx.get(f"{url}/v1/models", headers=bearer(alice)).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=bearer(new)).status_code == 200
    # a key sees its own usage; removed, it is refused
    r = corral("usage", "--host", url, "--json", env={"CORRAL_API_KEY": new})
    assert [x["key"] for x in json.loads(r.stdout)] == ["alice"]
    assert corral("keys", "rm", "alice", *kf).returncode == 0
    r = corral("usage", "--host", url, env={"CORRAL_API_KEY": new})
    assert r.returncode == 1 and "refused the API key" in r.stderr


def test_serve_refuses_a_broken_keys_file(tmp_path: Path) -> None:
    (tmp_path / "keys.toml").write_text('[keys.x]\nhash = "sha256:00"\n')
    (tmp_path / "c.toml").write_text('[server]\nkeys_file = "keys.toml"\ninclude_default_model = false\n')
    r = corral("serve", "-c", str(tmp_path / "c.toml"), timeout=60)
    assert r.returncode == 2 and "[keys.x]: hash must be" in r.stderr and str(tmp_path / "keys.toml") in r.stderr
    assert "Traceback" not in r.stderr
