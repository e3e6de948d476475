"""Images beside other streams (worker/media/side.py): the policy that keeps the streams'
rate. Alone, an image is encoded on the normal-priority image thread and decoded on the
engine's thread; beside a generating slot, both run on the niced image thread (its OpenMP
threads niced with it) and the decode goes to the side context, whose KV is copied back
into the slot: the same tokens as alone. Real engine, real libmtmd, two decode threads (so
the image threads start OpenMP teams of their own)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as ll
import pytest

from corral import wire
from corral.fit.layout import read_layout
from corral.fit.sizes import Sizes
from corral.worker.media import side as media_side
from corral.worker.engine import Engine
from corral.worker.cache.kv_store import restore_seq, save_seq
from corral.worker.media.side import BESIDE_NICE, BESIDE_THREAD, restream, thread_nice

from worker.conftest import run_engine, settings_for
from worker.media.test_vision_engine import GREEDY, M, chat, picture, user

pytestmark = pytest.mark.integration

BESIDE = BESIDE_THREAD
STREAM = wire.SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine2(model_path: Path, mmproj_path: Path) -> Iterator[Engine]:
    e = Engine(settings_for(model_path, n_parallel=2, ctx_len=2048, n_batch=8, threads=2, threads_batch=2,
                            mmproj=str(mmproj_path)))
    yield e
    e.close()


def _policies(name: str) -> list[int]:
    """The scheduling policy of each of this process's threads named ``name`` (/proc stat field 41)."""
    out = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            stat = f.read()
        if stat[stat.index(b"(") + 1: stat.rindex(b")")].decode(errors="replace") == name:
            out.append(int(stat[stat.rindex(b")") + 2:].split()[38]))
    return out


def _stream_running(e: Engine) -> None:
    e.submit(wire.GenerateRequest(id="stream", prompt="Once upon a time", params=STREAM))
    for _ in range(50):
        e.step()
        if any(s.job is not None and s.job.req.id == "stream" and s.n_gen > 0 for s in e.slots):
            return
    raise AssertionError("the stream never started generating")


def _run_until(e: Engine, rid: str) -> str:
    text = ""
    for _ in range(2000):
        for m in e.step():
            if isinstance(m, wire.Delta) and m.id == rid:
                text += m.text
            elif isinstance(m, wire.RequestFailed) and m.id == rid:
                raise AssertionError(m)
            elif isinstance(m, wire.Finished) and m.id == rid:
                return text
    raise AssertionError(f"{rid} never finished")


def test_an_image_alone_goes_on_the_engines_thread(engine2: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alone, the encode runs on the engine's own thread (its OpenMP team), as llama-server's:
    no second team of OpenMP threads comes to life (media_side.py: libgomp would make every
    team's barriers sleep while the teams outnumber the CPUs)."""
    v = engine2.media
    submitted, pieces, side = dict(v.threads.submitted), v.pieces, v.side_images
    threads: list[int] = []
    encode = v.proj.encode  # type: ignore[union-attr]

    def on_this_thread(span: object) -> object:
        threads.append(threading.get_native_id())
        return encode(span)  # type: ignore[arg-type]

    monkeypatch.setattr(v.proj, "encode", on_this_thread)
    run_engine(engine2, [wire.GenerateRequest(id="warm", prompt="Hi", params=GREEDY)])  # the engine's team
    before = len(os.listdir("/proc/self/task"))
    texts, _, _ = run_engine(engine2, [chat("alone", user(f"What is {M}?", picture(41)))])
    assert v.threads.submitted[False] - submitted[False] == 1 and v.threads.submitted[True] == submitted[True]
    assert threads == [threading.get_native_id()]  # the engine's (the test's) thread
    assert v.pieces - pieces == 2 and v.side_images == side  # 16 positions, n_batch 8: two pieces, in the steps
    assert len(os.listdir("/proc/self/task")) <= before  # no image thread, no OpenMP team of its own
    assert texts["alone"]


def _beside_a_stream(e: Engine, rid: str, *turns: wire.ChatMessage) -> str:
    for slot in e.slots:  # no prefix hit: the image is encoded and decoded again
        e._clear_slot(slot)
    _stream_running(e)
    e.submit(chat(rid, *turns))
    text = _run_until(e, rid)
    assert any(s.job is not None and s.job.req.id == "stream" for s in e.slots)  # still streaming
    e.abort("stream")
    run_engine(e, [])
    return text


def test_an_image_beside_a_stream_goes_niced_to_the_side_context_with_the_same_tokens(
        engine2: Engine, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    req = (user(f"Describe {M} briefly.", picture(42)),)
    v = engine2.media
    v.side.usable = False  # the reference: the same image beside the same stream, decoded in the steps
    try:
        pieces = v.pieces
        in_steps = _beside_a_stream(engine2, "a", *req)
        assert v.pieces - pieces == 2
    finally:
        v.side.usable = True
    submitted, pieces, side = dict(v.threads.submitted), v.pieces, v.side_images
    seen: tuple[list[int], list[int]] = ([], [])
    in_side: list[int] = []
    encode, run = v.proj.encode, v.side.run  # type: ignore[union-attr]

    def encode_and_look(span: object) -> object:  # on the beside thread, its OpenMP team still there
        out = encode(span)  # type: ignore[arg-type]
        seen[0].extend(thread_nice()[BESIDE])
        seen[1].extend(_policies(BESIDE))
        return out

    def run_and_look(*args: object) -> bytes:
        out = run(*args)  # type: ignore[arg-type]
        in_side.append(len(thread_nice()[BESIDE]))
        return out

    monkeypatch.setattr(v.proj, "encode", encode_and_look)
    monkeypatch.setattr(v.side, "run", run_and_look)
    beside = _beside_a_stream(engine2, "b", *req)
    assert v.threads.submitted[True] - submitted[True] == 2  # the encode and the side decode, niced
    assert v.pieces == pieces and v.side_images - side == 1  # none of the image in the engine's steps
    assert beside == in_steps  # the side context's KV is what the engine's steps compute
    assert v.kv_bytes > 0 and engine2.stats().kv_bytes == engine2.info.kv_bytes + v.kv_bytes  # counted
    assert 0 < v.side.compute_bytes < 4 * engine2.m.n_vocab * v.piece  # no room for a micro-batch's logits
    # the room the router's estimate and the fit plan keep for it from the start (fit.plan): its KV to the byte
    lo = read_layout(model_path)
    ctx = engine2.m.n_ctx_slot * engine2.m.n_slots
    planned, main = (Sizes(lo, engine2.m.n_slots, v.piece, side=side) for side in (True, False))
    side_kv = sum(planned.kv_layer(i, ctx) - main.kv_layer(i, ctx) for i in range(lo.n_layer))
    assert side_kv == v.side.kv_bytes - v.side.compute_bytes
    niced, policies = seen
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert len(niced) >= 2, niced  # the image thread and the OpenMP thread its 2-thread encode started
    assert in_side == [1]  # the side decode on one thread: no OpenMP team beside the engine's
    assert all(n == min(19, base + BESIDE_NICE) > base for n in niced), niced  # below the decode threads
    assert set(policies) == {os.SCHED_IDLE}  # and only on a core the decode threads leave
    # after the job its OpenMP team is gone (omp_pause_resource_all): the image thread alone is left
    assert len(thread_nice()[BESIDE]) == 1 and _policies(BESIDE) == [os.SCHED_IDLE]


def test_a_side_context_that_cannot_be_created_leaves_the_image_to_the_engine(
        engine2: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    req = (user(f"Name {M}.", picture(43)),)
    v = engine2.media
    v.side.usable = False
    try:
        in_steps = _beside_a_stream(engine2, "ref", *req)
    finally:
        v.side.usable = True
    kept, v.side.ctx = v.side.ctx, None  # as before the first image beside a stream
    monkeypatch.setattr(media_side.ll, "llama_init_from_model", lambda *a: None)  # no room for it
    try:
        pieces, side = v.pieces, v.side_images
        text = _beside_a_stream(engine2, "no-room", *req)
        assert not v.side.usable and v.side.ctx is None
    finally:
        v.side.ctx, v.side.usable = kept, True
    assert text == in_steps  # the request did not fail: the engine's steps decoded the image
    assert v.pieces - pieces == 2 and v.side_images == side


def test_a_state_restreamed_round_trips(engine2: Engine) -> None:
    run_engine(engine2, [wire.GenerateRequest(id="r", prompt="Once upon a time there", params=GREEDY)])
    slot = next(s for s in engine2.slots if s.cached)
    state = save_seq(engine2.m.ctx, slot.index)
    one = restream(state, 1)
    assert one is not None and len(one) < len(state)  # the other slots' empty streams left out
    back = restream(one, engine2.m.n_slots)
    assert back is not None and len(back) == len(state)
    pos_max = ll.llama_memory_seq_pos_max(engine2.m.memory, slot.index)
    ll.llama_memory_seq_rm(engine2.m.memory, slot.index, -1, -1)
    assert restore_seq(engine2.m.ctx, slot.index, back)  # the engine's context reads it back
    assert ll.llama_memory_seq_pos_max(engine2.m.memory, slot.index) == pos_max == len(slot.cached) - 1
    assert restream(state[:-3], 1) is None  # not the layout: refused, never guessed


def test_a_request_with_media_is_prepared_on_the_idle_intake_thread_with_its_share(engine2: Engine) -> None:
    """worker/process.py's reader sends a request that carries media to the media room's
    intake thread (nice, SCHED_IDLE: libmtmd's mel threads inherit it), which the step counts
    as media work in flight until it is prepared; a text request and a recording's windows
    (a media_group) are prepared on the ordinary render threads."""
    import concurrent.futures
    import queue
    import socket

    from corral.worker import process
    from corral.worker.media.side import INTAKE_THREAD

    v = engine2.media
    release, started = threading.Event(), threading.Event()
    where: dict[str, tuple[str, int, int]] = {}

    def prepare(req: wire.GenerateRequest) -> object:
        tid = threading.get_native_id()
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            stat = f.read()
        name = stat[stat.index(b"(") + 1: stat.rindex(b")")].decode()
        where[req.id] = (name, os.getpriority(os.PRIO_PROCESS, tid), int(stat[stat.rindex(b")") + 2:].split()[38]))
        if req.id == "media":
            started.set()
            assert release.wait(30)
        return req

    ours, theirs = socket.socketpair()
    inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
    reader = threading.Thread(target=process._reader, args=(theirs, inbox, prepare, None, None, v), daemon=True)
    reader.start()
    try:
        img = picture(44)
        ours.sendall(wire.encode(chat("media", user(f"Name {M}.", img))))
        assert started.wait(30)
        assert len(v._in_flight()) == 1 and v._prep  # the step sees it as media work in flight meanwhile
        ours.sendall(wire.encode(wire.GenerateRequest(id="text", messages=[wire.ChatMessage(role="user", content="Hi")])))
        ours.sendall(wire.encode(wire.GenerateRequest(id="window", prompt=f"{wire.MEDIA_MARKER} Transcribe",
                                                      images=[img], media_group="rec")))
        firsts = {getattr(inbox.get(timeout=30), "id") for _ in range(2)}
        assert firsts == {"text", "window"}  # not behind the media request held on the intake thread
        release.set()
        assert getattr(inbox.get(timeout=30), "id") == "media"
    finally:
        release.set()
        ours.close()
        reader.join(30)
    concurrent.futures.wait(list(v._prep), 30)  # its future ends just after its result is in the inbox
    assert not v._prep and not v._in_flight()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert where["media"] == (INTAKE_THREAD, min(19, base + BESIDE_NICE), os.SCHED_IDLE), where
    for rid in ("text", "window"):
        assert where[rid][0] != INTAKE_THREAD and where[rid][2] == os.SCHED_OTHER, where
