"""Real worker processes over a socketpair: streaming, aborts, load failures, lifecycle."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral import wire
from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL

from .client import WorkerClient
from .conftest import settings_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def worker(model_path: Path):
    with WorkerClient(settings_for(model_path, n_parallel=8, ctx_len=4096)) as c:
        c.ready = c.wait_ready()
        yield c


def test_ready_reports_model_and_memory(worker: WorkerClient) -> None:
    info = worker.ready.info
    assert info.n_slots == 8 and info.n_ctx_slot == 512 and info.n_ctx == 4096
    assert info.n_vocab == 262144
    assert info.model_bytes > 100_000_000
    assert info.kv_bytes > 0 and info.rss_bytes > info.model_bytes // 2
    assert not info.embedding and not info.has_chat_template


def test_eight_concurrent_streams_complete_with_exact_counts(worker: WorkerClient) -> None:
    p = wire.SamplingParams(max_tokens=16, ignore_eos=True, temperature=0.8, seed=3)
    ids = [f"c{i}" for i in range(8)]
    for i, rid in enumerate(ids):
        worker.send(wire.GenerateRequest(id=rid, prompt=f"Story {i}: once upon a time", params=p))
    deltas: dict[str, int] = {rid: 0 for rid in ids}
    finished: dict[str, wire.Finished] = {}
    while len(finished) < 8:
        m = worker.recv(60)
        if isinstance(m, wire.Delta):
            assert m.id not in finished
            deltas[m.id] += m.n_tokens
        else:
            assert isinstance(m, wire.Finished), m
            finished[m.id] = m
    assert {f.slot for f in finished.values()} == set(range(8))  # all ran at once
    for rid, f in finished.items():
        assert f.finish_reason == "length"
        assert f.usage.completion_tokens == 16
        assert deltas[rid] == 16


def test_abort_over_the_wire_and_next_request_gets_the_slot(model_path: Path) -> None:
    with WorkerClient(settings_for(model_path, n_parallel=1, ctx_len=1024)) as c:
        c.wait_ready()
        c.send(wire.GenerateRequest(id="long", prompt="Count:", params=wire.SamplingParams(
            max_tokens=900, ignore_eos=True, temperature=0.0)))
        c.send(wire.GenerateRequest(id="next", prompt="Hello", params=wire.SamplingParams(max_tokens=4)))
        first = c.recv(60)
        assert isinstance(first, wire.Delta) and first.id == "long"
        c.send(wire.Abort("long"))
        c.send(wire.Abort("long"))  # twice is harmless
        while True:
            m = c.recv(60)
            if isinstance(m, wire.Finished) and m.id == "long":
                break
            assert isinstance(m, wire.Delta) and m.id == "long", m
        assert m.finish_reason == "abort"
        assert m.usage.completion_tokens < 900
        text, _, fin = c.collect("next", 60)
        assert isinstance(fin, wire.Finished) and fin.slot == 0
        c.send(wire.StatsRequest())
        st = c.recv(10)
        assert isinstance(st, wire.Stats) and st.slots_busy == 0 and st.waiting == 0


def test_too_long_prompt_refused_and_worker_keeps_serving(worker: WorkerClient) -> None:
    _, _, fin = worker.generate(wire.GenerateRequest(id="huge", prompt="token " * 3000))
    assert isinstance(fin, wire.RequestFailed) and fin.code == "context_length_exceeded"
    assert "512" in fin.message
    _, _, fin = worker.generate(wire.GenerateRequest(id="fine", prompt="Hi", params=wire.SamplingParams(max_tokens=2)))
    assert isinstance(fin, wire.Finished)


def test_stats(worker: WorkerClient) -> None:
    worker.send(wire.StatsRequest())
    st = worker.recv(10)
    assert isinstance(st, wire.Stats)
    assert st.slots_total == 8 and st.slots_busy == 0
    assert st.tokens_generated > 0 and st.rss_bytes > 0


def _load_failure(model_path: str, tmp_path: Path) -> tuple[str, int]:
    s = wire.WorkerSettings(model_id="bad", model_path=model_path, threads=1, ctx_len=TEST_CTX_LEN, n_parallel=TEST_N_PARALLEL)
    with WorkerClient(s) as c:
        assert isinstance(c.recv(30), wire.Loading)
        msg = c.recv(60)
        assert isinstance(msg, wire.LoadFailed), msg
        rc = c.proc.wait(30)
    return msg.reason, rc


def test_load_failed_missing_file(tmp_path: Path) -> None:
    reason, rc = _load_failure(str(tmp_path / "nope.gguf"), tmp_path)
    assert "no such file" in reason and rc == 1


def test_load_failed_not_gguf(tmp_path: Path) -> None:
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model, just some text\n")
    reason, rc = _load_failure(str(p), tmp_path)
    assert "not a GGUF file: bad magic" in reason and rc == 1


def test_load_failed_truncated_gguf(tmp_path: Path, model_path: Path) -> None:
    p = tmp_path / "truncated.gguf"
    with open(model_path, "rb") as f:
        p.write_bytes(f.read(200_000))
    reason, rc = _load_failure(str(p), tmp_path)
    assert "could not load" in reason and rc == 1


def test_load_failed_directory(tmp_path: Path) -> None:
    reason, rc = _load_failure(str(tmp_path), tmp_path)
    assert "directory" in reason and rc == 1


def test_worker_exits_when_parent_socket_closes(model_path: Path) -> None:
    c = WorkerClient(settings_for(model_path, n_parallel=1, ctx_len=512))
    c.wait_ready()
    c.send(wire.GenerateRequest(id="busy", prompt="Go", params=wire.SamplingParams(max_tokens=400, ignore_eos=True)))
    assert isinstance(c.recv(60), wire.Delta)
    c.sock.close()
    assert c.proc.wait(20) == 0
    c.close()


def test_shutdown_exits_zero(model_path: Path) -> None:
    with WorkerClient(settings_for(model_path, n_parallel=1, ctx_len=512)) as c:
        c.wait_ready()
        c.send(wire.Shutdown())
        assert c.recv(30) is None
        assert c.proc.wait(20) == 0


def test_settings_file_and_bad_settings(model_path: Path, tmp_path: Path) -> None:
    import msgspec
    import subprocess
    import sys

    f = tmp_path / "s.json"
    f.write_bytes(msgspec.json.encode(settings_for(model_path, n_parallel=1, ctx_len=512)))
    import socket

    a, b = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral.worker", "--fd", str(b.fileno()), "--settings-file", str(f)],
        pass_fds=(b.fileno(),), stderr=subprocess.DEVNULL,
    )
    b.close()
    dec = wire.FrameDecoder()
    got: list[object] = []
    deadline = time.monotonic() + 60
    while len(got) < 2 and time.monotonic() < deadline:
        a.settimeout(max(0.1, deadline - time.monotonic()))
        got += [wire.decode_from_worker(x) for x in dec.feed(a.recv(65536))]
    assert isinstance(got[1], wire.Ready)
    a.close()
    assert proc.wait(20) == 0

    bad = subprocess.run(
        [sys.executable, "-m", "corral.worker", "--fd", "0", "--settings", '{"model_id": 3}'],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2 and "bad --settings" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = msgspec.json.encode(settings_for(model_path)).decode()
    nofd = subprocess.run(
        [sys.executable, "-m", "corral.worker", "--fd", "77", "--settings", good],
        capture_output=True, text=True, timeout=60,
    )
    assert nofd.returncode == 2 and "not an open socket" in nofd.stderr
    assert "Traceback" not in nofd.stderr


def test_worker_dies_with_its_parent_even_if_socket_stays_open(model_path: Path) -> None:
    """PR_SET_PDEATHSIG: a middle process spawns the worker and is SIGKILLed; this test
    keeps the other socket end open, so only the death signal can end the worker."""
    import signal
    import socket
    import subprocess
    import sys

    import msgspec

    ours, theirs = socket.socketpair()
    settings = msgspec.json.encode(settings_for(model_path, n_parallel=1, ctx_len=512)).decode()
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-m', 'corral.worker', '--fd', '{theirs.fileno()}',"
        f" '--settings', sys.argv[1]], pass_fds=({theirs.fileno()},))\n"
        "time.sleep(600)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", code, settings], pass_fds=(theirs.fileno(),))
    theirs.close()
    dec = wire.FrameDecoder()
    msgs: list[object] = []
    ours.settimeout(60)
    while not msgs:
        msgs += [wire.decode_from_worker(b) for b in dec.feed(ours.recv(65536))]
    loading = msgs[0]
    assert isinstance(loading, wire.Loading)
    middle.send_signal(signal.SIGKILL)
    middle.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(loading.pid, 0)
        except ProcessLookupError:
            break
        # The worker is not our child, so there is nothing to wait on: poll with a deadline.
        time.sleep(0.05)
    else:
        os.kill(loading.pid, signal.SIGKILL)
        raise AssertionError("worker outlived its parent")
    ours.close()


def test_malformed_request_is_answered_and_worker_goes_on(worker: WorkerClient) -> None:
    import msgspec

    body = msgspec.msgpack.encode({"type": "generate", "id": "broken", "params": {"max_tokens": "many"}})
    worker.sock.sendall(wire.HEADER.pack(len(body)) + body)
    msg = worker.recv(30)
    assert isinstance(msg, wire.RequestFailed) and msg.id == "broken" and msg.code == "invalid_request"
    assert "max_tokens" in msg.message
    _, _, fin = worker.generate(wire.GenerateRequest(id="after-broken", prompt="Hi",
                                                     params=wire.SamplingParams(max_tokens=2)))
    assert isinstance(fin, wire.Finished)


def test_a_worker_with_a_projector_keeps_libgomps_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The short OpenMP spin for every worker, libgomp's own for one with a vision projector
    (its SCHED_IDLE image thread would take a core at each decode thread's sleep), and
    whatever the environment already says wins."""
    from corral.worker.process import VISION_SPINCOUNT, _cpu_wait_policy

    plain = wire.WorkerSettings(model_id="m", model_path="/m.gguf")
    vision = wire.WorkerSettings(model_id="m", model_path="/m.gguf", mmproj="/p.gguf")
    for s, want in ((plain, "20000"), (vision, VISION_SPINCOUNT),
                    (wire.WorkerSettings(model_id="m", model_path="/m.gguf", mmproj="/p.gguf", embedding=True), "20000")):
        monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        _cpu_wait_policy(s)
        assert os.environ["GOMP_SPINCOUNT"] == want
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    _cpu_wait_policy(vision)
    assert os.environ["GOMP_SPINCOUNT"] == "5"
