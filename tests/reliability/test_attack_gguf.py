"""Hostile GGUF files against a real router (issue 45, "one bad file hides every model").

A 49-byte GGUF claiming an array of 2^62 u64 (or arrays nested 3,000 deep, or any file of
``testkit.gguf_hostile``, a symlink loop, a FIFO) in ``models_dir`` made the header reader
raise what nothing caught: every models_dir model vanished from every list, a reload unloaded
them, the lists, pulls and DELETEs answered 500, a pull that failed left its file, and a big
header was parsed on the event loop. Here each bad file is a model with status ``failed`` and
its reason in every list, the good model beside it lists, loads and survives a reload, the
bad one can be deleted, and no header is read on the event loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harness import Harness, chat

from corral.store import gguf as store_gguf
from corral.store import gguf_meta
from testkit.gguf_hostile import hostile_files, many_tensors, small_gguf

BAD = {"array-2e62-u64", "nested-3000", "empty", "not-gguf", "truncated-kv", "tensor-offset-past-end",
       "alignment-zero", "alignment-string", "string-2e62", "n-tensors-2e62"}


def _models_dir(tmp: Path, model_path: Path) -> Path:
    models = tmp / "models"
    models.mkdir()
    os.symlink(model_path, models / "good.gguf")  # the real model (its directory allowed below)
    files = hostile_files()
    for name in BAD:
        (models / f"{name}.gguf").write_bytes(files[name])
    os.symlink(models / "loop.gguf", models / "loop.gguf")
    os.mkfifo(models / "fifo.gguf")
    return models


async def _start(harness: Harness, models: Path, model_path: Path, **server: Any) -> httpx.AsyncClient:
    cfg = harness.config({}, models_dir=str(models), worker_command=None,
                         allowed_model_dirs=[str(model_path.parent)], **server)
    await harness.start(cfg, use_store=True)
    return harness.client


def _failed_ids() -> set[str]:
    return BAD | {"loop", "fifo"}


async def _no_500(r: httpx.Response) -> httpx.Response:
    """Never an internal error (a failed model's 503 is its answer), never a traceback."""
    assert r.status_code != 500, (r.request.url, r.text[:300])
    assert "Traceback" not in r.text and "Error" not in r.text, r.text[:300]
    return r


@pytest.mark.integration
async def test_bad_files_are_failed_models_beside_the_good_one(harness: Harness, model_path: Path) -> None:
    models = _models_dir(harness.tmp, model_path)
    c = await _start(harness, models, model_path)
    r = await _no_500(await c.get("/models"))
    listed = {m["id"]: m["status"] for m in r.json()["data"]}
    assert set(listed) == _failed_ids() | {"good"}, sorted(listed)
    assert listed["good"]["value"] == "unloaded"
    for mid in _failed_ids():
        assert listed[mid]["value"] == "failed" and listed[mid]["reason"], (mid, listed[mid])
        assert str(harness.tmp) not in listed[mid]["reason"]  # the file's name, never where it lies
    assert "2 and 3" not in listed["array-2e62-u64"]["reason"] and "elements" in listed["array-2e62-u64"]["reason"]
    assert "nests arrays" in listed["nested-3000"]["reason"] and "symlink loop" in listed["loop"]["reason"]

    v1 = {m["id"]: m["status"] for m in (await _no_500(await c.get("/v1/models"))).json()["data"]}
    assert v1["good"]["value"] == "unloaded" and all(v1[m]["value"] == "failed" and v1[m]["reason"]
                                                     for m in _failed_ids())
    tags = {m["name"]: m for m in (await _no_500(await c.get("/api/tags"))).json()["models"]}
    assert set(tags) == _failed_ids() | {"good"} and "status" not in tags["good"]
    assert all(tags[m]["status"] == "failed" and tags[m]["reason"] for m in _failed_ids())
    assert tags["good"]["details"]["family"] == "gemma3"
    for mid in ("array-2e62-u64", "nested-3000", "loop", "fifo", "empty"):
        show = (await _no_500(await c.get("/models/show", params={"model": mid}))).json()
        assert show["status"] == "failed" and show["reason"], show
        api_show = (await _no_500(await c.post("/api/show", json={"model": mid}))).json()
        assert api_show["status"] == "failed" and api_show["reason"], api_show
        r = await _no_500(await c.post("/v1/chat/completions", json=chat(mid, max_tokens=1)))
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed", r.text
        assert "does not read as GGUF" in r.json()["error"]["message"]
    assert (await c.get("/models/show", params={"model": "good"})).json()["architecture"] == "gemma3"

    r = await c.post("/v1/chat/completions", json=chat("good", max_tokens=2))
    assert r.status_code == 200, r.text
    assert (await _no_500(await c.get("/api/ps"))).json()["models"][0]["name"] == "good"
    r = await _no_500(await c.post("/models/reload"))
    assert r.json()["removed"] == [] and r.json()["added"] == [], r.json()  # the bad ones unload nothing
    assert harness.plane.is_loaded("good")
    assert (await c.get("/health")).status_code == 200


async def test_bad_files_can_be_deleted_and_a_pull_beside_them_works(harness: Harness, model_path: Path,
                                                                     hub: Any) -> None:
    models = _models_dir(harness.tmp, model_path)
    c = await _start(harness, models, model_path)
    r = await _no_500(await c.delete("/models/array-2e62-u64"))
    assert r.status_code == 200 and r.json()["deleted"], r.text
    r = await _no_500(await c.request("DELETE", "/api/delete", json={"model": "nested-3000"}))
    assert r.status_code == 200, r.text
    r = await _no_500(await c.delete("/models/loop"))
    assert r.status_code == 200, r.text
    assert not (models / "array-2e62-u64.gguf").exists() and not (models / "nested-3000.gguf").exists()
    assert not os.path.lexists(models / "loop.gguf")
    listed = {m["id"] for m in (await c.get("/models")).json()["data"]}
    assert {"array-2e62-u64", "nested-3000", "loop"}.isdisjoint(listed) and "good" in listed

    hub.add("me/fine-GGUF/fine.gguf", small_gguf())
    r = await _no_500(await c.post("/models/pull", json={"model": "me/fine-GGUF/fine.gguf"}))
    assert r.status_code == 202, r.text
    assert await harness.app.state.downloads.get(r.json()["id"]).wait() == "finished"
    assert (models / "fine.gguf").is_file()


async def test_a_pull_of_a_bad_file_leaves_nothing(harness: Harness, model_path: Path, hub: Any) -> None:
    models = harness.tmp / "models"
    models.mkdir()
    c = await _start(harness, models, model_path)
    for i, name in enumerate(("array-2e62-u64", "nested-3000", "tensor-offset-past-end", "not-gguf")):
        hub.add(f"me/bad{i}-GGUF/{name}.gguf", hostile_files()[name])
        r = await _no_500(await c.post("/models/pull", json={"model": f"me/bad{i}-GGUF/{name}.gguf"}))
        assert r.status_code == 202, r.text
        h = harness.app.state.downloads.get(r.json()["id"])
        assert await h.wait() == "failed"
        assert "not a readable GGUF" in (h.reason or ""), h.reason
    left = [p for p in models.rglob("*") if not p.is_dir()]
    assert left == [], left
    assert (await c.get("/models")).json()["data"] == []


@pytest.fixture
def held_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Every header read waits for ``release`` (``entered`` says one began): a read on the event
    loop would hold /health until then."""
    entered, release = threading.Event(), threading.Event()
    real = store_gguf.read_header

    def held(path: Any, **kw: Any) -> Any:
        entered.set()
        assert release.wait(30), "never released"
        return real(path, **kw)

    monkeypatch.setattr(store_gguf, "read_header", held)
    monkeypatch.setattr(gguf_meta, "read_header", held)
    yield entered, release
    release.set()


async def test_header_reads_never_hold_the_event_loop(harness: Harness, model_path: Path,
                                                      held_reads: tuple[threading.Event, threading.Event]) -> None:
    entered, release = held_reads
    models = harness.tmp / "models"
    models.mkdir()
    release.set()  # the first listing (at start) may read
    c = await _start(harness, models, model_path)
    release.clear()
    (models / "many.gguf").write_bytes(many_tensors(60_000))  # a 2 MB header: 0.4 s of parsing here
    for k, (method, url, body) in enumerate((("POST", "/models/reload", None), ("GET", "/models/show?model=many", None),
                                            ("GET", "/api/tags", None), ("DELETE", "/models/many", None))):
        if k:  # a new version of the file: the cached reads are read again
            (models / "many.gguf").write_bytes(many_tensors(60_000 - k))
            os.utime(models / "many.gguf", ns=(k, k))
        entered.clear()
        task = asyncio.create_task(c.request(method, url, json=body))
        assert await asyncio.to_thread(entered.wait, 10), url
        r = await c.get("/health")  # the read is under way, held: the loop answers meanwhile
        assert r.status_code == 200 and not task.done(), url
        release.set()
        assert (await task).status_code < 500, url
        release.clear()
    release.set()


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(field)


async def test_the_malformed_set_costs_the_router_little_memory(harness: Harness, model_path: Path) -> None:
    models = harness.tmp / "models"
    models.mkdir()
    c = await _start(harness, models, model_path)
    for url in ("/models", "/v1/models", "/api/tags"):
        assert (await c.get(url)).status_code == 200
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
    before = _rss("VmRSS")
    for name, data in hostile_files().items():
        (models / f"{name}.gguf").write_bytes(data)
    (models / "many.gguf").write_bytes(many_tensors(70_000))  # past the tensor bound
    assert (await c.post("/models/reload")).status_code == 200
    for url in ("/models", "/v1/models", "/api/tags", "/api/ps"):
        assert (await c.get(url)).status_code == 200
    for name in hostile_files():
        assert (await c.get("/models/show", params={"model": name})).json()["status"] == "failed"
    assert _rss("VmHWM") - before < 50 << 20


async def test_nitro_loadmodel_and_config_paths_name_the_problem(harness: Harness, model_path: Path) -> None:
    bad = harness.tmp / "files"
    bad.mkdir()
    for name in ("nested-3000", "array-2e62-u64", "tensor-offset-past-end"):
        (bad / f"{name}.gguf").write_bytes(hostile_files()[name])
    os.mkfifo(bad / "fifo.gguf")
    cfg = harness.config({"cfgbad": {"path": str(bad / "nested-3000.gguf")}}, worker_command=None,
                         allowed_model_dirs=[str(bad)])
    await harness.start(cfg)
    c = harness.client
    (m,) = (await c.get("/models")).json()["data"]
    assert m["id"] == "cfgbad" and m["status"]["value"] == "failed" and "nests arrays" in m["status"]["reason"]
    r = await _no_500(await c.post("/v1/completions", json={"model": "cfgbad", "prompt": "x", "max_tokens": 1}))
    assert r.status_code == 503 and "nests arrays" in r.json()["error"]["message"], r.text
    assert harness.plane.pools["cfgbad"].instances == []  # no worker was given the file
    for name, words in (("array-2e62-u64", "elements"), ("tensor-offset-past-end", "past the end"),
                        ("fifo", "not a regular file")):
        r = await _no_500(await c.post("/inferences/llamacpp/loadmodel", json={
            "model_id": f"n-{name}", "llama_model_path": str(bad / f"{name}.gguf")}))
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "llama_model_path", r.text
        assert "not a readable GGUF" in err["message"] and words in err["message"], err
        assert f"n-{name}" not in harness.plane.pools
    assert (await c.get("/health")).status_code == 200


async def test_corral_show_and_ls_say_why(harness: Harness, model_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli.main import app

    models = _models_dir(harness.tmp, model_path)
    await _start(harness, models, model_path)
    runner = CliRunner()
    r = await asyncio.to_thread(runner.invoke, app, ["show", "nested-3000", "--server", harness.base_url])
    assert r.exit_code == 0, r.output
    assert "failed" in r.output and "reason" in r.output and "nests arrays" in r.output, r.output
    r = await asyncio.to_thread(runner.invoke, app, ["ls", "--server", harness.base_url, "--models-dir", str(models)])
    assert r.exit_code == 0, r.output
    assert "array-2e62-u64: failed: key 'k' claims 4611686018427387904 elements" in r.output, r.output
