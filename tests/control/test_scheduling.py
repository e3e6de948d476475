"""Slots, queue, eviction, budget, TTL, disconnects, balancing: fake workers."""

from __future__ import annotations

import asyncio

from corral.control.placement.memory import memory_bytes
from support.fake_link import FakeSpawner, fake_pool, spec
from support.harness import Harness, chat, wait_event
from support.harness import _until


async def test_queue_fifo_then_full_503(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a", slow_delay_s=0.05)), "n_parallel": 1}},
                         max_queue=2)
    plane = await harness.start(cfg)
    c = harness.client
    first = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "SLOW 1"}))
    await _until(lambda: plane.pools["a"].inflight == 1)
    second = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "SLOW 2"}))
    await _until(lambda: len(plane.pools["a"].waiters) == 1)
    third = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "SLOW 3"}))
    await _until(lambda: len(plane.pools["a"].waiters) == 2)
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "4"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["Retry-After"]) >= 1
    for t in (first, second, third):
        assert (await t).status_code == 200
    # FIFO: the worker saw them in arrival order
    assert [x["prompt"] for x in harness.requests_seen("a")] == ["SLOW 1", "SLOW 2", "SLOW 3"]


async def test_request_queue_timeout_503(harness: Harness) -> None:
    """The opt-in bound on a request's wait for a slot (absent: it waits while its client does)."""
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1}},
                         request_queue_timeout_s=0.3)
    plane = await harness.start(cfg)
    c = harness.client
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)
        r = await c.post("/v1/completions", json={"model": "a", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_timeout"
        assert "Retry-After" in r.headers


async def test_disconnect_aborts_and_frees_the_slot(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a", token_delay_s=0.01)), "n_parallel": 1}})
    plane = await harness.start(cfg)
    c = harness.client
    async with c.stream("POST", "/v1/chat/completions", json=chat("a", "FOREVER", stream=True)) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and "Hello" in line:
                break
    # the stream is closed: the worker must be told, and the slot freed
    await _until(lambda: plane.pools["a"].inflight == 0)
    seen = harness.requests_seen("a")
    assert seen[-1] == {"type": "abort", "id": seen[0]["id"]}
    r = await c.post("/v1/chat/completions", json=chat("a"))
    assert r.status_code == 200
    # non-streaming requests are aborted on disconnect too
    task = asyncio.create_task(c.post("/v1/chat/completions", json=chat("a", "FOREVER")))
    await _until(lambda: plane.pools["a"].inflight == 1)
    task.cancel()
    await _until(lambda: plane.pools["a"].inflight == 0)
    assert harness.requests_seen("a")[-1]["type"] == "abort"


async def test_eviction_skips_busy_model_and_takes_lru_idle(harness: Harness) -> None:
    models = {m: {"path": str(harness.script(m))} for m in ("a", "b", "c")}
    await harness.serve(models, max_loaded_models=2)
    plane = harness.plane
    c = harness.client
    await c.post("/models/load", json={"model": "a"})  # a: least recently used ...
    await c.post("/models/load", json={"model": "b"})
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)  # ... but busy
        async with plane.bus.subscribe() as q:
            r = await c.post("/v1/completions", json={"model": "c", "prompt": "x"})
            assert r.status_code == 200
            ev = await wait_event(q, lambda e: e.get("new") == "stopped")
        assert ev["model"] == "b" and "evicted to make room for c" in ev["reason"]
        assert {m for m, p in plane.pools.items() if p.occupies} == {"a", "c"}


async def test_no_room_when_all_busy_gives_503_capacity_timeout(harness: Harness) -> None:
    models = {m: {"path": str(harness.script(m))} for m in ("a", "b")}
    await harness.serve(models, max_loaded_models=1, queue_timeout_s=0.3)
    plane = harness.plane
    c = harness.client
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)
        r = await c.post("/v1/completions", json={"model": "b", "prompt": "x"})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "capacity_timeout" and "max_loaded_models=1" in r.json()["error"]["message"]
        assert "Retry-After" in r.headers
        assert plane.pools["a"].has_ready and not plane.pools["b"].occupies


async def test_single_gpu_mode_waits_for_busy_model_then_switches(harness: Harness) -> None:
    models = {"a": {"path": str(harness.script("a", slow_delay_s=0.05))}, "b": {"path": str(harness.script("b"))}}
    await harness.serve(models, max_loaded_models=1)
    plane = harness.plane
    c = harness.client
    slow = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "SLOW"}))
    await _until(lambda: plane.pools["a"].inflight == 1)
    r = await c.post("/v1/completions", json={"model": "b", "prompt": "x"})
    assert r.status_code == 200
    assert slow.done() and (await slow).status_code == 200  # a finished before b loaded
    assert not plane.pools["a"].occupies


async def test_pinned_model_is_never_evicted(harness: Harness) -> None:
    models = {"a": {"path": str(harness.script("a")), "pinned": True}, "b": {"path": str(harness.script("b"))}}
    await harness.serve(models, max_loaded_models=1, queue_timeout_s=0.3)
    plane = harness.plane
    await harness.client.post("/models/load", json={"model": "a"})
    r = await harness.client.post("/models/load", json={"model": "b"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "capacity_timeout"
    assert plane.pools["a"].has_ready


async def test_memory_budget_uses_reported_sizes(harness: Harness) -> None:
    models = {"a": {"path": str(harness.script("a", model_bytes=600, kv_bytes=100))},
              "b": {"path": str(harness.script("b", model_bytes=500, kv_bytes=100))}}
    await harness.serve(models, memory_budget=1000)
    plane = harness.plane
    await harness.client.post("/models/load", json={"model": "a"})
    assert memory_bytes(plane.pools["a"]) == 700
    async with plane.bus.subscribe() as q:
        r = await harness.client.post("/models/load", json={"model": "b"})
        assert r.status_code == 200
        ev = await wait_event(q, lambda e: e.get("new") == "stopped")
    assert ev["model"] == "a" and "memory_budget" in ev["reason"]
    assert plane.pools["b"].has_ready


async def test_idle_ttl_unloads(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a")), "ttl_s": 0.3}})
    plane = harness.plane
    async with plane.bus.subscribe() as q:
        assert (await harness.client.post("/v1/completions", json={"model": "a", "prompt": "x"})).status_code == 200
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        ev = await wait_event(q, lambda e: e.get("new") == "stopping")
        assert loop.time() - t0 >= 0.25
    assert "ttl_s" in ev["reason"]
    await _until(lambda: plane.pools["a"].status() == "unloaded")


async def test_balancing_prefers_prefix_then_least_busy() -> None:
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(instances=2, n_parallel=2))
    pool.start()
    await _until(lambda: all(i.state.value == "ready" for i in pool.instances))
    system = "You are a careful assistant. " * 4  # > 64 characters shared
    # two concurrent requests spread over both instances (least busy)
    assert pool.try_acquire(system + "FOREVER one") is not None
    assert pool.try_acquire("other FOREVER") is not None
    assert pool.inflight == 2
    assert sorted(pool.busy(i) for i in pool.instances) == [1, 1]
    holder = next(i for i in pool.instances if any(r.startswith(system) for r in pool.recent(i)))
    # a request sharing the long prefix goes to the instance that served it
    assert pool.try_acquire(system + "FOREVER two") is holder
    assert pool.inflight == 3
    assert pool.busy(holder) == 2


async def test_client_leaving_the_queue_is_forgotten(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1}})
    plane = await harness.start(cfg)
    c = harness.client
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: plane.pools["a"].inflight == 1)
        queued = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "queued"}))
        await _until(lambda: len(plane.pools["a"].waiters) == 1)
        queued.cancel()
        await _until(lambda: len(plane.pools["a"].waiters) == 0)
    await _until(lambda: plane.pools["a"].inflight == 0)
    assert (await c.post("/v1/completions", json={"model": "a", "prompt": "after"})).status_code == 200
    prompts = [x.get("prompt") for x in harness.requests_seen("a") if x["type"] == "generate"]
    assert prompts == ["FOREVER", "after"]  # the one that left never reached the worker


async def test_many_concurrent_requests_never_exceed_slots(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a", token_delay_s=0.002)), "instances": 2,
                                "n_parallel": 2}}, max_queue=100)
    plane = await harness.start(cfg)
    await harness.client.post("/models/load", json={"model": "a"})
    await _until(lambda: all(i.state.value == "ready" for i in plane.pools["a"].instances))
    pool = plane.pools["a"]
    peak = 0
    orig = pool._pick

    def watching(prefix):  # noqa: ANN001, ANN202
        nonlocal peak
        inst = orig(prefix)
        peak = max(peak, pool.inflight)
        assert all(pool.busy(i) <= i.slots_total for i in pool.instances)
        return inst

    pool._pick = watching  # type: ignore[method-assign]
    rs = await asyncio.gather(*(harness.client.post("/v1/completions", json={"model": "a", "prompt": f"p{i}"})
                                for i in range(40)))
    assert [r.status_code for r in rs] == [200] * 40
    assert peak == 4 and pool.inflight == 0 and not pool.waiters
    assert {i.index for i in pool.instances if pool.last_used_of(i)} == {0, 1}  # both instances served
    stats = await pool.instances[0].fetch_stats()
    assert stats is not None and stats.slots_total == 2 and stats.slots_busy == 0


async def test_a_slow_load_does_not_hold_up_other_models(harness: Harness) -> None:
    models = {"slow": {"path": str(harness.script("slow", load_delay_s=1.0))}, "b": {"path": str(harness.script("b"))}}
    await harness.serve(models)
    plane = harness.plane
    await harness.client.post("/models/load", json={"model": "b"})
    loading = asyncio.create_task(harness.client.post("/v1/completions", json={"model": "slow", "prompt": "x"}))
    await _until(lambda: plane.pools["slow"].status() == "loading")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    r = await harness.client.post("/v1/completions", json={"model": "b", "prompt": "x"})
    assert r.status_code == 200 and loop.time() - t0 < 0.5
    assert not loading.done()
    assert (await loading).status_code == 200
