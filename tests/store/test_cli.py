"""`corral pull / ls / rm` with typer's CliRunner, locally and through a server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from typer.testing import CliRunner

from corral.cli import store_cmds
from corral.cli.main import app
from corral.events import EventBus
from corral.store.local import ModelStore

from .conftest import small_gguf
from .fake_hub import FakeHub
from .store_app import FakeRouter, make_app, serve_in_thread

REPO = "me/cli-GGUF"
NO_SERVER = "http://127.0.0.1:9"  # discard port: nothing listens


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_ls_and_rm_locally(runner: CliRunner, store: ModelStore) -> None:
    r = runner.invoke(app, ["ls", "--models-dir", str(store.root)])
    assert r.exit_code == 0 and "no models" in r.output
    (store.root / "one-Q4_K_M.gguf").write_bytes(b"x" * 2000)
    r = runner.invoke(app, ["ls", "--models-dir", str(store.root)])
    assert r.exit_code == 0
    # 2000 bytes, in binary units as `corral ps` and the rest print them
    assert "one-Q4_K_M" in r.output and "Q4_K_M" in r.output and "2.0 KiB" in r.output
    r = runner.invoke(app, ["ls", "--json", "--models-dir", str(store.root)])
    assert json.loads(r.output)[0]["id"] == "one-Q4_K_M"
    r = runner.invoke(app, ["rm", "nope", "--server", NO_SERVER, "--models-dir", str(store.root)])
    assert r.exit_code == 1 and "not in the store" in r.output
    r = runner.invoke(app, ["rm", "one-Q4_K_M", "--server", NO_SERVER, "--models-dir", str(store.root)])
    assert r.exit_code == 0 and store.list() == []


def test_ls_shows_a_file_that_does_not_read_as_failed(runner: CliRunner, store: ModelStore) -> None:
    from testkit.gguf_hostile import hostile_files

    (store.root / "fine.gguf").write_bytes(small_gguf(2000))
    (store.root / "deep.gguf").write_bytes(hostile_files()["nested-3000"])
    r = runner.invoke(app, ["ls", "--server", NO_SERVER, "--models-dir", str(store.root)])
    assert r.exit_code == 0, r.output
    assert "fine" in r.output and "failed" in r.output and "deep: failed: key 'k' nests arrays" in r.output
    r = runner.invoke(app, ["ls", "--json", "--server", NO_SERVER, "--models-dir", str(store.root)])
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert rows["fine"]["problem"] is None and "nests arrays" in rows["deep"]["problem"]


def test_pull_locally(runner: CliRunner, hub: FakeHub, store: ModelStore) -> None:
    data = small_gguf(80_000)
    hub.add(f"{REPO}/c-Q8_0.gguf", data)
    r = runner.invoke(app, ["pull", f"{REPO}:Q8_0", "--server", NO_SERVER,
                            "--models-dir", str(store.root)])
    assert r.exit_code == 0, r.output
    assert f"pulled {REPO}:Q8_0" in r.output  # the name it was pulled by
    assert store.get(f"{REPO}:Q8_0").path.read_bytes() == data  # type: ignore[union-attr]
    r = runner.invoke(app, ["pull", f"{REPO}/missing.gguf", "--server", NO_SERVER,
                            "--models-dir", str(store.root)])
    assert r.exit_code == 1 and "not found" in r.output
    r = runner.invoke(app, ["pull", "bad source", "--server", NO_SERVER,
                            "--models-dir", str(store.root)])
    assert r.exit_code == 1 and "cannot read model source" in r.output


async def test_ctrl_c_cancels_a_local_pull(hub: FakeHub, store: ModelStore) -> None:
    f = hub.add(f"{REPO}/slow.gguf", small_gguf(3_000_000))
    f.behavior.bytes_per_s = 300_000
    task = asyncio.create_task(store_cmds._pull_locally(store, f"{REPO}/slow.gguf", None, None))
    deadline = time.monotonic() + 20
    while not any(p.stat().st_size > 0 for p in store.partial_dir.glob("*.part")):
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.05)  # the CLI's bus is private: watch the partial file
    os.kill(os.getpid(), signal.SIGINT)
    assert await asyncio.wait_for(task, 20) == 130
    (part,) = store.partial_dir.glob("*.part")
    assert 0 < part.stat().st_size < 3_000_000 and store.list() == []


def test_pull_and_rm_through_a_server(runner: CliRunner, hub: FakeHub, store: ModelStore) -> None:
    data = small_gguf(120_000)
    hub.add(f"{REPO}/srv-Q8_0.gguf", data)
    router = FakeRouter()
    other_dir = store.root.parent / "ignored"
    with serve_in_thread(make_app(store, EventBus(), router)) as url:
        r = runner.invoke(app, ["pull", f"{REPO}/srv-Q8_0.gguf", "--server", url,
                                "--models-dir", str(other_dir)])
        assert r.exit_code == 0, r.output
        assert "pulled srv-Q8_0" in r.output and "models dir of the server" in r.output
        assert store.get("srv-Q8_0") is not None and not other_dir.exists()

        r = runner.invoke(app, ["pull", f"{REPO}/srv-Q8_0.gguf", "--server", url])
        assert r.exit_code == 1 and "already exists" in r.output

        router.loaded.add("srv-Q8_0")
        r = runner.invoke(app, ["rm", "srv-Q8_0", "--server", url])
        assert r.exit_code == 1 and "is loaded" in r.output and store.get("srv-Q8_0")
        r = runner.invoke(app, ["rm", "srv-Q8_0", "--force", "--server", url])
        assert r.exit_code == 0 and router.unloaded == ["srv-Q8_0"]
        assert store.get("srv-Q8_0") is None
