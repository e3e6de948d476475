"""DownloadManager + fetch child against the fake hub: resume, cancel, failures, events."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from corral.store import downloads as dl
from corral.store.downloads import DownloadManager, ProgressThrottle
from corral.events import EventBus
from corral.errors import Conflict, DownloadCancelled, DownloadError, InvalidRequest, NotFound
from corral.store.local import ModelStore

from .conftest import small_gguf
from .fake_hub import COMMIT, FakeHub

TERMINAL = {"download_finished", "download_failed", "download_cancelled"}
REPO = "me/tiny-GGUF"


_managers: list[DownloadManager] = []


@pytest.fixture(autouse=True)
async def _close_managers():
    yield
    while _managers:  # every child reaped before the test's loop closes
        await _managers.pop().close()


def manager(store: ModelStore, bus: EventBus, finished: list | None = None, **kw) -> DownloadManager:
    kw.setdefault("retry_backoff_s", 0.02)
    kw.setdefault("retries", 3)

    def on_finished(model_id: str, path: Path) -> None:
        if finished is not None:
            finished.append((model_id, path))

    dm = DownloadManager(store, bus, on_finished, **kw)
    _managers.append(dm)
    return dm


async def until(q: asyncio.Queue, pred, timeout: float = 30.0) -> list[dict]:
    """Events from ``q`` up to and including the first that matches ``pred``."""
    seen: list[dict] = []

    async def run() -> list[dict]:
        while True:
            ev = await q.get()
            seen.append(ev)
            if pred(ev):
                return seen

    return await asyncio.wait_for(run(), timeout)


def terminal_for(pull_id: str):
    return lambda ev: ev["event"] in TERMINAL and ev.get("pull_id") == pull_id


async def test_successful_pull_event_sequence(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    data = small_gguf(400_000)
    hub.add(f"{REPO}/tiny-Q8_0.gguf", data)
    finished: list = []
    dm = manager(store, bus, finished)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/tiny-Q8_0.gguf")
        assert h.model_id == "tiny-Q8_0"
        events = await until(q, terminal_for(h.pull_id))
        await h.wait()
    names = [e["event"] for e in events]
    assert names[0] == "download_started"
    assert names[-1] == "download_finished"
    assert set(names[1:-1]) <= {"download_progress"}
    assert events[0]["total"] == len(data) and events[0]["source"] == f"{REPO}/tiny-Q8_0.gguf"
    fin = events[-1]
    assert fin["sha256"] == hashlib.sha256(data).hexdigest() and fin["size"] == len(data)
    assert all(e["model"] == "tiny-Q8_0" and e["pull_id"] == h.pull_id for e in events)
    (m,) = store.list()
    assert m.id == "tiny-Q8_0" and m.path.read_bytes() == data and m.quantization == "Q8_0"
    assert m.source == f"{REPO}/tiny-Q8_0.gguf" and m.sha256 == fin["sha256"]
    assert finished == [("tiny-Q8_0", m.path)]
    assert dm.progress("tiny-Q8_0") is None and dm.find_by_model("tiny-Q8_0") is None
    assert not any(store.partial_dir.iterdir())  # nothing left behind
    # the token from HF_TOKEN went to the hub
    assert any(r.auth == "Bearer hf_test_token" for r in hub.requests if r.method == "GET")


async def test_tag_form_picks_single_file_skipping_mmproj(hub: FakeHub, store: ModelStore,
                                                          bus: EventBus) -> None:
    want = small_gguf(50_000, seed=2)
    hub.add(f"{REPO}/mmproj-tiny-Q8_0.gguf", small_gguf(20_000, seed=3))
    hub.add(f"{REPO}/tiny-Q8_0-00001-of-00002.gguf", small_gguf(20_000, seed=4))
    hub.add(f"{REPO}/tiny-Q8_0-00002-of-00002.gguf", small_gguf(20_000, seed=5))
    hub.add(f"{REPO}/tiny-Q8_0.gguf", want)
    hub.add(f"{REPO}/tiny-Q4_K_M.gguf", small_gguf(20_000, seed=6))
    dm = manager(store, bus)
    h = await dm.start(f"{REPO}:q8_0", model_id="picked")
    assert await h.wait() == "finished"
    assert store.get("picked").path.read_bytes() == want  # type: ignore[union-attr]
    with pytest.raises(InvalidRequest, match="no .gguf file with tag Q2_K; it has Q4_K_M, Q8_0"):
        await dm.start(f"{REPO}:Q2_K")


async def test_cut_mid_file_resumes_from_partial(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    data = small_gguf(500_000)
    f = hub.add(f"{REPO}/cut-Q8_0.gguf", data)
    f.behavior.cut_after = 123_456
    dm = manager(store, bus)
    h = await dm.start(f"{REPO}/cut-Q8_0.gguf")
    assert await h.wait() == "finished", h.reason
    assert hub.range_starts(f"{REPO}/cut-Q8_0.gguf") == [None, 123_456]
    assert store.get("cut-Q8_0").path.read_bytes() == data  # type: ignore[union-attr]


async def test_server_ignoring_range_restarts_from_zero(hub: FakeHub, store: ModelStore,
                                                        bus: EventBus) -> None:
    data = small_gguf(300_000)
    f = hub.add(f"{REPO}/norange.gguf", data)
    f.behavior.cut_after = 100_000
    f.behavior.ignore_range = True
    h = await manager(store, bus).start(f"{REPO}/norange.gguf")
    assert await h.wait() == "finished", h.reason
    assert hub.range_starts(f"{REPO}/norange.gguf") == [None, 100_000]  # asked; got a 200
    assert store.get("norange").path.read_bytes() == data  # type: ignore[union-attr]


async def test_cancel_is_cancelled_not_failed_and_pull_again_resumes(
        hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    data = small_gguf(2_000_000)
    f = hub.add(f"{REPO}/slow-Q8_0.gguf", data)
    f.behavior.bytes_per_s = 400_000
    dm = manager(store, bus, progress_interval_s=0.1)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/slow-Q8_0.gguf")
        await until(q, lambda e: e["event"] == "download_progress" and e["done"] > 0)
        assert dm.progress("slow-Q8_0")["pull_id"] == h.pull_id  # type: ignore[index]
        assert await dm.cancel(h.pull_id) is True
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_cancelled"
    assert not any(e["event"] == "download_failed" for e in events)
    assert h.state == "cancelled" and await dm.cancel(h.pull_id) is False
    assert h.partial_path is not None
    kept = h.partial_path.stat().st_size
    assert 0 < kept < len(data) and events[-1]["done"] == kept
    assert store.list() == []  # a partial is never listed

    f.behavior.bytes_per_s = None
    h2 = await dm.start(f"{REPO}:Q8_0")  # another name for the same file resumes it too
    assert h2.pull_id != h.pull_id and h2.done == kept
    assert await h2.wait() == "finished", h2.reason
    assert hub.range_starts(f"{REPO}/slow-Q8_0.gguf")[-1] == kept
    assert store.get(f"{REPO}:Q8_0").path.read_bytes() == data  # type: ignore[union-attr]  # its name


async def test_router_restart_resumes(hub: FakeHub, store: ModelStore) -> None:
    data = small_gguf(2_000_000)
    f = hub.add(f"{REPO}/restart.gguf", data)
    f.behavior.bytes_per_s = 400_000
    bus1 = EventBus()
    dm1 = manager(store, bus1, progress_interval_s=0.1)
    async with bus1.subscribe() as q:
        await dm1.start(f"{REPO}/restart.gguf")
        await until(q, lambda e: e["event"] == "download_progress" and e["done"] > 0)
    await dm1.close()  # the router goes away mid-download
    with pytest.raises(DownloadError):
        await dm1.start(f"{REPO}/restart.gguf")
    (part,) = store.partial_dir.glob("*.part")
    kept = part.stat().st_size
    assert kept > 0

    f.behavior.bytes_per_s = None
    dm2 = manager(store, EventBus())  # a new router process
    h = await dm2.start(f"{REPO}/restart.gguf")
    assert await h.wait() == "finished", h.reason
    assert hub.range_starts(f"{REPO}/restart.gguf")[-1] == kept
    assert store.get("restart").path.read_bytes() == data  # type: ignore[union-attr]


async def test_wrong_bytes_fail_checksum_and_are_removed(hub: FakeHub, store: ModelStore,
                                                         bus: EventBus) -> None:
    f = hub.add(f"{REPO}/bad.gguf", small_gguf(200_000))
    f.behavior.wrong_bytes = True
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/bad.gguf")
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_failed"
    assert "checksum mismatch" in events[-1]["reason"]
    assert store.list() == [] and not (store.root / "bad.gguf").exists()
    assert list(store.partial_dir.iterdir()) == []


async def test_url_source_with_user_sha256(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    data = small_gguf(100_000)
    hub.add("plain/web-F16.gguf", data)
    dm = manager(store, bus, allow_private=lambda: ["127.0.0.1/32"])  # the fake hub is on loopback
    h = await dm.start(f"{hub.url}/plain/web-F16.gguf", sha256="ab" * 32)
    assert await h.wait() == "failed" and "checksum mismatch" in (h.reason or "")
    h = await dm.start(f"{hub.url}/plain/web-F16.gguf", sha256=hashlib.sha256(data).hexdigest())
    assert await h.wait() == "finished"
    m = store.get("web-F16")
    assert m is not None and m.source == f"{hub.url}/plain/web-F16.gguf" and m.quantization == "F16"


@pytest.mark.parametrize(
    ("setup", "exc", "words"),
    [
        ("missing", NotFound, "not found"),
        ("gated", InvalidRequest, "HF_TOKEN"),
        ("head401", InvalidRequest, "HF_TOKEN"),
    ],
)
async def test_resolve_failures_raise_and_publish(hub: FakeHub, store: ModelStore, bus: EventBus,
                                                  setup: str, exc: type, words: str) -> None:
    f = hub.add(f"{REPO}/there.gguf", small_gguf(10_000))
    source = f"{REPO}/there.gguf"
    if setup == "missing":
        source = f"{REPO}/absent.gguf"
    elif setup == "gated":
        f.behavior.gated = True
    else:
        f.behavior.head_status = 401
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        with pytest.raises(exc, match=words) as info:
            await dm.start(source)
        ev = await asyncio.wait_for(q.get(), 5)
    assert info.value.status in (400, 404)
    assert ev["event"] == "download_failed" and words in ev["reason"]
    assert store.list() == []


async def test_server_errors_are_retried_then_fail(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    data = small_gguf(50_000)
    f = hub.add(f"{REPO}/flaky.gguf", data)
    f.behavior.get_status, f.behavior.get_status_times = 503, 2
    dm = manager(store, bus, retries=3)
    h = await dm.start(f"{REPO}/flaky.gguf")
    assert await h.wait() == "finished"  # two 503s, then it worked

    f2 = hub.add(f"{REPO}/down.gguf", data)
    f2.behavior.get_status = 500
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/down.gguf")
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_failed"
    assert "HTTP 500" in events[-1]["reason"] and "gave up after 4 attempts" in events[-1]["reason"]
    assert f2.gets == 4
    assert store.get("down") is None


async def test_not_enough_disk_space(hub: FakeHub, store: ModelStore, bus: EventBus,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add(f"{REPO}/big.gguf", small_gguf(100_000))
    monkeypatch.setattr(dl, "disk_free", lambda path: 1000)
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        with pytest.raises(DownloadError, match="not enough disk space") as info:
            await dm.start(f"{REPO}/big.gguf")
        ev = await asyncio.wait_for(q.get(), 5)
    assert info.value.status == 507
    assert ev["event"] == "download_failed" and "not enough disk space" in ev["reason"]
    assert hub.range_starts(f"{REPO}/big.gguf") == []  # no byte was fetched
    assert store.list() == []


async def test_same_file_twice_shares_one_process(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    f = hub.add(f"{REPO}/shared.gguf", small_gguf(600_000))
    f.behavior.bytes_per_s = 1_000_000
    dm = manager(store, bus)
    a, b = await asyncio.gather(dm.start(f"{REPO}/shared.gguf"), dm.start(f"{REPO}/shared.gguf"))
    assert a is b and dm.spawned == 1
    c = await dm.start(f"{REPO}/shared.gguf")  # while it runs
    assert c is a and dm.spawned == 1
    assert await a.wait() == "finished"
    assert len(hub.range_starts(f"{REPO}/shared.gguf")) == 1


async def test_progress_events_are_throttled(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    data = small_gguf(1_500_000)
    f = hub.add(f"{REPO}/throttled.gguf", data)
    f.behavior.bytes_per_s = 750_000  # about 2 s; the child reports every 0.2 s
    dm = manager(store, bus, progress_interval_s=0.5)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/throttled.gguf")
        t0 = asyncio.get_running_loop().time()
        events = await until(q, terminal_for(h.pull_id))
        took = asyncio.get_running_loop().time() - t0
    progress = [e for e in events if e["event"] == "download_progress"]
    assert 2 <= len(progress) <= took / 0.5 + 2, (len(progress), took)
    dones = [e["done"] for e in progress]
    assert dones == sorted(dones) and any(e["eta_s"] is not None for e in progress)


def test_throttle_needs_time_and_a_visible_change() -> None:
    now = [0.0]
    t = ProgressThrottle(0.5, clock=lambda: now[0])
    assert t.should_emit(10, 1000, 9.0)
    now[0] = 0.2
    assert not t.should_emit(500, 1000, 5.0)  # too soon
    now[0] = 1.0
    assert t.should_emit(500, 1000, 5.0)
    now[0] = 2.0
    assert not t.should_emit(501, 1000, 5.4)  # same percent, same second of ETA
    assert t.should_emit(520, 1000, 5.4)


async def test_hf_cache_hit_uses_file_in_place(hub: FakeHub, store: ModelStore, bus: EventBus,
                                               tmp_path: Path) -> None:
    data = small_gguf(30_000)
    sha = hashlib.sha256(data).hexdigest()
    repo_dir = Path(os.environ["HF_HOME"]) / "hub" / "models--me--cached-GGUF"
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "blobs" / sha).write_bytes(data)
    snap = repo_dir / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "c-Q4_0.gguf").symlink_to(Path("../..") / "blobs" / sha)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        h = await dm.start("me/cached-GGUF/c-Q4_0.gguf")
        events = await until(q, terminal_for(h.pull_id))
    assert [e["event"] for e in events] == ["download_started", "download_finished"]
    assert hub.requests == []  # nothing asked of the hub
    m = store.get("c-Q4_0")
    assert m is not None and m.path == snap / "c-Q4_0.gguf" and m.sha256 == sha
    store.remove("c-Q4_0")  # forgets it, but the user's HF cache keeps the file
    assert (repo_dir / "blobs" / sha).exists() and store.get("c-Q4_0") is None


async def test_bad_input_is_rejected_before_any_process(store: ModelStore, bus: EventBus) -> None:
    dm = manager(store, bus)
    with pytest.raises(InvalidRequest, match="cannot read model source"):
        await dm.start("not a source")
    with pytest.raises(InvalidRequest, match="sha256"):
        await dm.start("a/b/c.gguf", sha256="xyz")
    with pytest.raises(InvalidRequest, match="invalid model id"):
        await dm.start("a/b/c.gguf", model_id="../evil")
    (store.root / "taken.gguf").write_bytes(b"GGUF")
    with pytest.raises(Conflict, match="already exists"):
        await dm.start("a/b/c.gguf", model_id="taken")
    assert dm.spawned == 0


async def test_a_crashing_child_is_a_failed_download(hub: FakeHub, store: ModelStore,
                                                     bus: EventBus) -> None:
    f = hub.add(f"{REPO}/crash.gguf", small_gguf(2_000_000))
    f.behavior.bytes_per_s = 300_000
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/crash.gguf")
        dm._procs[h.pull_id].kill()  # not a cancel: the process just dies
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_failed"
    assert events[-1]["reason"] == ("the download process exited unexpectedly "
                                     "(killed by SIGKILL)")
    assert store.list() == []


def test_router_side_imports_no_hub_client_and_no_engine() -> None:
    import subprocess
    import sys

    code = ("import sys, corral.store.downloads, corral.api.manage.store, corral.cli.store_cmds;"
            "bad = [m for m in ('huggingface_hub', 'llama_cpp') if m in sys.modules];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_disk_full_while_writing(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    from corral.store.fetch import partial_paths

    hub.add(f"{REPO}/full.gguf", small_gguf(100_000))
    store.ensure_dirs()
    part, _ = partial_paths(store, f"hf:{REPO}/full.gguf")
    part.symlink_to("/dev/full")  # every write: ENOSPC
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        h = await dm.start(f"{REPO}/full.gguf")
        events = await until(q, terminal_for(h.pull_id))
    assert events[-1]["event"] == "download_failed"
    assert events[-1]["reason"] == f"disk full while writing {part}"
    assert store.list() == []


async def test_one_file_two_ids_at_once_is_refused(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    f = hub.add(f"{REPO}/twice.gguf", small_gguf(2_000_000))
    f.behavior.bytes_per_s = 400_000
    dm = manager(store, bus)
    first = await dm.start(f"{REPO}/twice.gguf", model_id="one")
    with pytest.raises(Conflict, match="being downloaded by another pull"):
        await dm.start(f"{REPO}/twice.gguf", model_id="two")
    assert first.active and dm.spawned == 2
    f.behavior.bytes_per_s = None
    await dm.cancel(first.pull_id)
    h = await dm.start(f"{REPO}/twice.gguf", model_id="two")  # free again; resumes
    assert await h.wait() == "finished" and store.get("two") is not None


async def test_offline_tag_form_from_cache_and_offline_miss(
        hub: FakeHub, store: ModelStore, bus: EventBus, monkeypatch: pytest.MonkeyPatch) -> None:
    data = small_gguf(20_000)
    sha = hashlib.sha256(data).hexdigest()
    repo_dir = Path(os.environ["HF_HOME"]) / "hub" / "models--me--offline-GGUF"
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "blobs" / sha).write_bytes(data)
    snap = repo_dir / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "o-Q5_K_M.gguf").symlink_to(Path("../..") / "blobs" / sha)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    dm = manager(store, bus)
    h = await dm.start("me/offline-GGUF:Q5_K_M")
    assert await h.wait() == "finished" and h.path == snap / "o-Q5_K_M.gguf"
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE is set"):
        await dm.start("me/elsewhere-GGUF/x.gguf")
    assert hub.requests == []


async def test_cancel_while_looking_up_the_file(hub: FakeHub, store: ModelStore, bus: EventBus) -> None:
    f = hub.add(f"{REPO}/slowmeta.gguf", small_gguf(10_000))
    f.behavior.head_delay_s = 5.0
    dm = manager(store, bus)
    async with bus.subscribe() as q:
        start = asyncio.create_task(dm.start(f"{REPO}/slowmeta.gguf"))
        # start() has not returned a handle, nor published download_started (that comes once
        # the file is resolved): the hub saying the child's lookup arrived is the event
        assert await asyncio.to_thread(f.behavior.head_arrived.wait, 10)
        (h,) = dm.active()
        assert h.state == "resolving" and dm.find_by_model("slowmeta") is h
        t0 = asyncio.get_running_loop().time()
        assert await dm.cancel(h.pull_id) is True
        with pytest.raises(DownloadCancelled):
            await start
        assert asyncio.get_running_loop().time() - t0 < 3  # did not wait for the hub
        ev = await asyncio.wait_for(q.get(), 5)
    assert ev["event"] == "download_cancelled" and ev["pull_id"] == h.pull_id


async def test_lookup_timeout_is_the_reason_not_the_sigterm(hub: FakeHub, store: ModelStore, bus: EventBus,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    f = hub.add(f"{REPO}/slowlookup.gguf", small_gguf(10_000))
    f.behavior.head_delay_s = 5.0
    dm = manager(store, bus, resolve_timeout_s=0.3)
    stop = dm._stop

    async def stop_then_let_the_watcher_finish(pull_id: str) -> None:  # the race, made certain
        await stop(pull_id)
        await dm.get(pull_id)._ended.wait()

    monkeypatch.setattr(dm, "_stop", stop_then_let_the_watcher_finish)
    async with bus.subscribe() as q:
        with pytest.raises(DownloadError, match="timed out while looking up"):
            await dm.start(f"{REPO}/slowlookup.gguf")
        ev = await asyncio.wait_for(q.get(), 5)
    assert ev["event"] == "download_failed" and "timed out" in ev["reason"], ev
