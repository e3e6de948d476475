"""The worker's loop with a stand-in engine: how messages are gathered into steps."""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace

from corral import wire
from corral.worker import process
from corral.worker.sampling.pool import SamplePool
from support.waiting import until


class _Engine:
    """Records which requests each step saw; a request 'generates' for ``steps`` steps."""

    def __init__(self, steps: int = 3) -> None:
        self.left: dict[str, int] = {}
        self.steps_seen: list[list[str]] = []
        self.steps = steps
        self.pool = SamplePool(1)  # the loop sets its cap from the governor
        self.preempt = SimpleNamespace(urgent=SimpleNamespace(take=lambda rid: None))  # worker/preempt/urgent.py

    @property
    def has_work(self) -> bool:
        return bool(self.left)

    def submit(self, req: wire.GenerateRequest) -> None:
        self.left[req.id] = self.steps

    def step(self) -> list:
        self.steps_seen.append(sorted(self.left))
        for rid in list(self.left):
            self.left[rid] -= 1
            if not self.left[rid]:
                del self.left[rid]
        return []

    def take_output(self) -> list:
        return []


class _Out:
    broken = False

    def send(self, msgs: list) -> None:
        pass


class _NoGovernor:
    enabled = False
    interval_s = 0.5
    free_cores = 2

    def tick(self) -> None:
        pass

    def wake(self) -> None:
        pass


def _loop_beside(engine: _Engine, inbox, feed) -> None:  # noqa: ANN001
    """Run the loop while ``feed`` runs in a thread; what the feed raised (a wait past its
    deadline) fails the test."""
    raised: list[BaseException] = []

    def guarded() -> None:
        try:
            feed()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            raised.append(exc)

    t = threading.Thread(target=guarded)
    t.start()
    assert process._loop(engine, inbox, _Out(), _NoGovernor()) == 0
    t.join()
    if raised:
        raise raised[0]


def _run(engine: _Engine, feed) -> None:  # noqa: ANN001
    inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
    _loop_beside(engine, inbox, lambda: feed(inbox))
    assert engine.pool.cap == _NoGovernor.free_cores  # sampling never on more than the free cores


def _req(i: int) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=f"r{i}", prompt="x")


def test_requests_arriving_together_at_an_idle_engine_start_in_one_step(monkeypatch) -> None:  # noqa: ANN001
    # wider windows than the defaults, so a busy test machine cannot split the arrivals
    monkeypatch.setattr(process, "_GATHER_GAP_S", 0.05)
    monkeypatch.setattr(process, "_GATHER_MAX_S", 0.5)
    engine = _Engine()

    def feed(inbox) -> None:  # noqa: ANN001
        for i in range(4):
            inbox.put(_req(i))
            time.sleep(0.002)  # clients whose requests ended together come back apart
        try:
            until(lambda: engine.steps_seen and not engine.has_work, what="the four requests to end")
        finally:
            inbox.put(process._EOF)

    _run(engine, feed)
    assert engine.steps_seen[0] == ["r0", "r1", "r2", "r3"]


def test_a_busy_engine_does_not_wait_for_more_requests() -> None:
    """While anything generates, a new request joins at the very next step: the loop
    never holds a step back to gather (that would slow every running stream)."""
    engine = _Engine(steps=10_000)
    waits: list[float | None] = []

    class _Inbox(queue.SimpleQueue):  # type: ignore[type-arg]
        def get(self, block: bool = True, timeout: float | None = None):  # noqa: ANN201
            if engine.has_work and block:
                waits.append(timeout)
            return super().get(block, timeout)

    inbox = _Inbox()
    inbox.put(_req(0))

    def feed() -> None:
        try:
            until(lambda: len(engine.steps_seen) >= 5, what="five steps", interval=0.0005)
            inbox.put(_req(1))
            until(lambda: any("r1" in seen for seen in engine.steps_seen[-100:]), what="r1 in a step",
                  interval=0.0005)
        finally:
            inbox.put(process._EOF)

    _loop_beside(engine, inbox, feed)
    assert engine.pool.cap == _NoGovernor.free_cores  # sampling never on more than the free cores
    joined = next(i for i, seen in enumerate(engine.steps_seen) if "r1" in seen)
    assert joined > 0
    # the gather happened once, when r0 found the engine idle; never after
    assert len(waits) <= 1
