"""An instance's state is written by its owner task only; commands (a start and the GPU
placement it brings) go through the inbox, and what a pending start is about to do
counts at once: "holds memory" is one property of the instance."""

from __future__ import annotations

import asyncio

import pytest

from corral.control.placement.gpu_slot import GpuSlot
from corral.control.instance.instance import InstanceState
from support.fake_link import FakeSpawner, fake_pool, spec

S = InstanceState


async def test_a_start_waiting_behind_a_failed_one_still_holds_memory() -> None:
    spawner = FakeSpawner()
    spawner.fail.append(OSError("no such file"))  # the first spawn fails for good
    pool = fake_pool(spawner)
    seen: list[tuple[bool, str, bool]] = []
    spawner.on_spawn.append(lambda _: seen.append((pool.occupies, pool.status(), pool.failed_final)))
    pool.start()
    inst = pool.instances[0]
    later = inst.request_start()  # a second start, queued behind the pool's
    await asyncio.wait_for(later, 5)  # the pool's start failed; this one spawned again, and is ready
    # while each start spawned its worker, the pool held its place (admission counts it)
    assert seen == [(True, "loading", False), (True, "loading", False)]
    assert inst.state is S.READY and inst.holds_memory and len(spawner.settings) == 2 and len(spawner.links) == 1


async def test_holds_memory_from_the_start_command_to_the_stop() -> None:
    spawner = FakeSpawner(ready=False)
    pool = fake_pool(spawner)
    pool.start()
    inst = pool.instances[0]
    assert inst.state is S.STOPPED and inst.holds_memory and pool.occupies  # before the owner ran
    link = await spawner.next_link()
    assert inst.state is S.STARTING and inst.holds_memory
    link.ready()
    await pool.wait_ready(5)
    assert inst.holds_memory and pool.live() == [inst]
    await pool.stop("test")
    assert inst.state is S.STOPPED and not inst.holds_memory and not pool.occupies and pool.live() == []


async def test_the_gpu_placement_travels_with_the_start() -> None:
    spawner = FakeSpawner()
    pool = fake_pool(spawner, spec(instances=2))
    slots = [GpuSlot([1], [100], [900], 10), GpuSlot([0], [100], [800], 10)]
    pool.start(gpus=slots)
    assert [i.gpu for i in pool.instances] == slots  # seen at once (admission charges the GPUs)
    await pool.wait_ready(5)
    assert sorted((s.instance, s.devices) for s in spawner.settings) == [(0, [1]), (1, [0])]
    with pytest.raises(AttributeError):
        pool.instances[0].gpu = None  # type: ignore[misc]  # only the owner writes it
    await pool.stop("test")
    pool.start(fresh=False)  # a start with no GPU: the placement is gone
    assert [i.gpu for i in pool.instances] == [None, None]
    await pool.wait_ready(5)
    assert [s.devices for s in spawner.settings[2:]] == [None, None]
