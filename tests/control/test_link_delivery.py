"""The order in which one read of a worker's channel reaches the requests: the Deltas that
start a request first (a client's time to first token does not wait behind every other
request's next token), each request's own messages in the order the worker sent them."""

from __future__ import annotations

import asyncio

from corral import wire
from corral.control.scheduling.pool import ModelPool
from corral.control.stream import RequestStream
from support.fake_link import FakeLink, FakeSpawner, fake_pool, finished, spec


async def _ready(pool: ModelPool, spawner: FakeSpawner) -> FakeLink:
    pool.start()
    await pool.wait_ready(5)
    return spawner.links[-1]


class _Recorded(RequestStream):
    """Appends (id, text) to ``log`` for each Delta it gets."""

    def __init__(self, request_id: str, log: list[tuple[str, str]]) -> None:
        super().__init__(request_id, "m")
        self.log = log

    def on_delta(self, msg: wire.Delta) -> None:
        self.log.append((self.id, msg.text))
        super().on_delta(msg)


async def _streams(n: int) -> tuple[FakeLink, list[_Recorded], list[tuple[str, str]]]:
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(n_parallel=n))
    link = await _ready(pool, spawner)
    log: list[tuple[str, str]] = []
    streams = [_Recorded(f"r{i}", log) for i in range(n)]
    for s in streams:
        inst = pool.try_acquire(None)
        assert inst is not None
        assert inst.submit(s.id, wire.encode(wire.GenerateRequest(id=s.id, prompt="hi")), s)
    return link, streams, log


async def test_first_tokens_are_delivered_and_woken_before_the_others_of_the_same_read() -> None:
    link, (old1, old2, new), log = await _streams(3)
    link.say(wire.Delta("r0", "a", 1), wire.Delta("r1", "a", 1))
    assert old1.take_all().text == old2.take_all().text == "a"
    log.clear()
    woken: list[tuple[str, str]] = []

    async def read(s: RequestStream) -> None:
        piece = await s.next_piece()
        assert piece is not None
        woken.append((s.id, piece.text))

    readers = [asyncio.create_task(read(s)) for s in (old1, old2, new)]
    await asyncio.sleep(0)  # each reader waits for text
    # one step frame, the newest request last, then its second token and its end
    link.say(wire.Delta("r0", "b", 1), wire.Delta("r1", "b", 1), wire.Delta("r2", "x", 1),
             wire.Delta("r2", "y", 1), finished("r2", 2))
    assert log == [("r2", "x"), ("r0", "b"), ("r1", "b"), ("r2", "y")]
    await asyncio.gather(*readers)
    assert woken == [("r2", "xy"), ("r0", "b"), ("r1", "b")]
    assert new.finished is not None and not old1.done and not old2.done


async def test_a_first_delta_stays_behind_an_earlier_message_for_its_request() -> None:
    link, (old, new), log = await _streams(2)
    link.say(wire.Delta("r0", "a", 1))
    log.clear()
    paused: list[str] = []
    new.on_pause = lambda msg: paused.append(f"{msg.id} paused, then {len(log)} deltas")
    link.say(wire.Delta("r0", "b", 1), wire.Paused(id="r1", paused=False), wire.Delta("r1", "x", 1))
    assert paused == ["r1 paused, then 1 deltas"]
    assert log == [("r0", "b"), ("r1", "x")]
