"""The fair order of a queued burst: keys, weights, priority and aging (fake workers)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from corral.control.scheduling.fair_queue import FairQueue
from support.harness import Harness, _until, chat
from support.keys import bearer


# ------------------------------------------------------------------ the queue alone


def _fut() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


async def test_one_key_one_priority_is_fifo() -> None:
    q = FairQueue()
    ws = [q.push(_fut(), None, "-", 1.0, 0) for _ in range(5)]
    order = []
    while (w := q.next()) is not None:
        q.serve(w)
        order.append(w)
    assert order == ws and len(q) == 0


async def test_the_key_below_its_share_goes_first() -> None:
    q = FairQueue()
    q.started("heavy", 1.0)  # heavy holds a slot and queues 100 more
    heavy = [q.push(_fut(), None, "heavy", 1.0, 0) for _ in range(100)]
    light = q.push(_fut(), None, "light", 1.0, 0)
    assert q.next() is light
    q.serve(light)
    assert q.next() is heavy[0]  # both hold one slot now; heavy's waiter is older
    q.ended("light", 10)  # light is idle again: forgotten, its next request starts level
    q.ended("heavy", 1000)
    again = q.push(_fut(), None, "light", 1.0, 0)
    assert q.next() is heavy[0]  # equal busy (0), equal virtual time: the oldest
    q.serve(heavy[0])
    assert q.next() is again  # heavy holds a slot, light none


async def test_weights_share_the_service() -> None:
    q = FairQueue()
    for _ in range(12):
        q.push(_fut(), None, "a", 2.0, 0)
    for _ in range(12):
        q.push(_fut(), None, "b", 1.0, 0)
    served = []
    for _ in range(9):  # one slot: each request ends before the next starts, 10 tokens each
        w = q.next()
        assert w is not None
        q.serve(w)
        q.ended(w.key, 10)
        served.append(w.key)
    assert served.count("a") == 6 and served.count("b") == 3, served


async def test_busy_slots_are_weighed() -> None:
    q = FairQueue()
    q.started("a", 2.0)  # a: 1 slot of weight 2 (0.5); b: 1 slot of weight 1 (1.0)
    q.started("b", 1.0)
    b = q.push(_fut(), None, "b", 1.0, 0)
    a = q.push(_fut(), None, "a", 2.0, 0)
    assert q.next() is a
    q.serve(a)  # a: 2 slots of weight 2 (1.0), b: 1.0; equal virtual time: the older waiter
    assert q.next() is b


async def test_priority_within_a_key_and_aging() -> None:
    q = FairQueue(aging_s=lambda: 10.0)
    low = q.push(_fut(), None, "k", 1.0, 0)
    high = q.push(_fut(), None, "k", 1.0, 3)
    assert q.next() is high
    low.since -= 31  # waited 31 s: worth 3.1 levels, above a fresh priority 3
    assert q.next() is low
    q.remove(low)
    assert q.next() is high and len(q) == 1
    assert q.remove(low) is False  # removing twice is harmless


# ------------------------------------------------------------------ through the router


async def _start(harness: Harness, **keys: dict[str, Any]) -> tuple[dict[str, str], Any]:
    secrets = await harness.serve({"a": {"path": str(harness.script("a")), "n_parallel": 1}}, keys=keys)
    return secrets, harness.plane


async def _burst(harness: Harness, plane: Any, opener: str,
                 queued: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Hold the one slot with ``opener``'s stream, queue ``queued`` (key secret, body) in
    this order, free the slot; the prompts in the order the worker got them."""
    c = harness.client
    pool = plane.pools["a"]
    tasks: list[asyncio.Task[httpx.Response]] = []
    async with c.stream("POST", "/v1/chat/completions", headers=bearer(opener),
                        json=chat("a", "FOREVER", stream=True)) as s:
        lines = s.aiter_lines()  # kept: a dropped iterator closes the stream
        assert (await anext(lines)).startswith("data: ")
        await _until(lambda: pool.inflight == 1)
        for n, (secret, body) in enumerate(queued, 1):
            tasks.append(asyncio.create_task(c.post("/v1/completions", headers=bearer(secret),
                                                    json={"model": "a", **body})))
            await _until(lambda n=n: len(pool.waiters) == n)  # queued in this order
    for r in await asyncio.gather(*tasks):
        assert r.status_code == 200, r.text
    return [x["prompt"] for x in harness.requests_seen("a") if x.get("prompt")]  # not the opener's chat


async def test_a_burst_of_one_key_does_not_hold_back_another(harness: Harness) -> None:
    secrets, plane = await _start(harness, heavy={}, light={})
    heavy, light = secrets["heavy"], secrets["light"]
    queued = [(heavy, {"prompt": f"heavy {i}"}) for i in range(8)] + [(light, {"prompt": "light 0"})]
    order = await _burst(harness, plane, heavy, queued)
    # heavy's stream held the slot; when it ended neither key held one, and heavy had been
    # served (the stream's tokens) while light had not: light first, not after heavy 7;
    # heavy's own requests in their order
    assert order == ["light 0"] + [f"heavy {i}" for i in range(8)], order
    q = plane.pools["a"].waiters
    await _until(lambda: q.busy_of("heavy") == q.busy_of("light") == 0)  # every slot given back
    assert plane.pools["a"].inflight == 0 and not plane.pools["a"].waiters


async def test_priority_orders_a_keys_requests(harness: Harness) -> None:
    secrets, plane = await _start(harness, k={"max_priority": 9})
    k = secrets["k"]
    queued = [(k, {"prompt": "p0 first"}), (k, {"prompt": "p5", "priority": 5}),
              (k, {"prompt": "p0 second"}), (k, {"prompt": "p9", "priority": 9}),
              (k, {"prompt": "p-1", "priority": -1})]
    order = await _burst(harness, plane, k, queued)
    assert order == ["p9", "p5", "p0 first", "p0 second", "p-1"], order


async def test_without_keys_the_queue_is_fifo(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "n_parallel": 1}})
    plane = harness.plane
    queued = [("none", {"prompt": f"r{i}"}) for i in range(6)]
    order = await _burst(harness, plane, "none", queued)
    assert order == [f"r{i}" for i in range(6)]
