"""One huge prompt must not stall the other streams of its model: prompts are tokenized
on the worker's reader thread, never on the thread that runs the decode loop, and input
that cannot fit is refused before it is tokenized."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from corral import wire
from corral.worker import process
from corral.worker.engine import Engine
from corral.worker.intake import Intake

pytestmark = pytest.mark.integration


def test_prompts_are_tokenized_off_the_decode_thread(model_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    where: list[str] = []
    real_prepare = Intake.prepare  # engine.prepare is the engine's intake's
    real_step = Engine.step
    step_threads: set[str] = set()

    def prepare(self: Intake, req: wire.GenerateRequest):  # noqa: ANN202
        where.append(threading.current_thread().name)
        return real_prepare(self, req)

    def step(self: Engine):  # noqa: ANN202
        step_threads.add(threading.current_thread().name)
        return real_step(self)

    monkeypatch.setattr(Intake, "prepare", prepare)
    monkeypatch.setattr(Engine, "step", step)
    router_end, worker_end = socket.socketpair()
    settings = wire.WorkerSettings(model_id="m", model_path=str(model_path), threads=1, n_parallel=2,
                                   ctx_len=512)
    rc: list[int] = []
    t = threading.Thread(target=lambda: rc.append(process.serve(worker_end, settings)), name="engine-loop")
    t.start()
    dec = wire.FrameDecoder()
    got: dict[str, object] = {}

    def send(msg: wire.ToWorker) -> None:
        router_end.sendall(wire.encode(msg))

    try:
        router_end.settimeout(120)
        huge = "lorem ipsum " * 600_000  # 7.2 MB: far past what 256 tokens can cover
        send(wire.GenerateRequest(id="short", prompt="Hello", params=wire.SamplingParams(max_tokens=8)))
        send(wire.GenerateRequest(id="huge", prompt=huge, params=wire.SamplingParams(max_tokens=8)))
        while len(got) < 2:
            data = router_end.recv(1 << 16)
            assert data, "worker closed the socket"
            for body in dec.feed(data):
                msg = wire.decode_from_worker(body)
                if isinstance(msg, (wire.Finished, wire.RequestFailed)):
                    got[msg.id] = msg
    finally:
        router_end.close()
        t.join(60)
    assert rc == [0]
    assert isinstance(got["short"], wire.Finished)
    failed = got["huge"]
    assert isinstance(failed, wire.RequestFailed) and failed.code == "context_length_exceeded"
    assert "not tokenized" in failed.message
    assert where == ["corral-reader", "corral-reader"]
    assert step_threads == {"engine-loop"}
