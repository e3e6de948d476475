"""CorePlacer: busy neighbours at fewer threads keep to different cores (no model)."""

from __future__ import annotations

import os
import threading

import pytest

from corral.worker.cores import CorePlacer


def test_neighbours_take_different_cores() -> None:
    a, b = CorePlacer(0, {0, 1}), CorePlacer(1, {0, 1})
    assert a.cores_for(1) == {0} and b.cores_for(1) == {1}
    assert a.cores_for(2) is None and b.cores_for(2) is None  # all cores: no pin
    four = [CorePlacer(k, {0, 1, 2, 3}) for k in range(2)]
    assert four[0].cores_for(2) == {0, 1} and four[1].cores_for(2) == {2, 3}
    assert CorePlacer(3, {4, 5, 6, 7}).cores_for(1) == {7}  # the cores it may use, not 0..n


def test_no_slot_no_pin() -> None:
    p = CorePlacer(None, {0, 1})
    assert not p.enabled and p.cores_for(1) is None
    p.apply(1)
    assert p.pinned is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and 2 cores (CI has both)")
def test_apply_pins_every_thread_and_lifts_the_pin() -> None:
    allowed = set(os.sched_getaffinity(0))
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    p = CorePlacer(1, allowed)
    try:
        p.apply(1)
        want = p.cores_for(1)
        assert want is not None and len(want) == 1 and p.pinned == want
        tids = [int(x) for x in os.listdir("/proc/self/task")]
        assert all(os.sched_getaffinity(tid) == want for tid in tids)
        p.apply(len(allowed))
        assert p.pinned is None
        assert all(os.sched_getaffinity(int(x)) == allowed for x in os.listdir("/proc/self/task"))
    finally:
        stop.set()
        os.sched_setaffinity(0, allowed)
        t.join()


def test_the_spawner_gives_live_workers_different_slots(tmp_path) -> None:
    from types import SimpleNamespace

    from corral.control.link import LocalSpawner

    sp = LocalSpawner(tmp_path)
    live = {0: SimpleNamespace(returncode=None), 1: SimpleNamespace(returncode=None)}
    sp._cpu_slots.update(live)  # type: ignore[arg-type]
    assert sp._free_cpu_slot() == 2
    live[0].returncode = 0  # the worker in slot 0 exited: its slot is free again
    assert sp._free_cpu_slot() == 0
