"""Sampling the slots of a step on several threads: the pool itself (no model), the
setting, and the governor's cap. The engine with the real model: test_parallel_sampling.py."""

from __future__ import annotations

import os
import threading

import pytest

from corral.model.settings import ModelSettings, SettingsError
from corral.worker.host.cpu import ThreadGovernor
from corral.worker.sampling.pool import AUTO_CPU_MAX, AUTO_GPU_MAX, SamplePool, resolve_sampling_threads


def test_map_keeps_the_order_and_uses_the_pool_threads() -> None:
    pool = SamplePool(3)
    seen: dict[int, str] = {}
    gate = threading.Barrier(3, timeout=10)  # only passes if three threads run items at once

    def work(i: int) -> int:
        if i < 3:
            gate.wait()
        seen[i] = threading.current_thread().name
        return i * i

    try:
        assert pool.map(work, list(range(12))) == [i * i for i in range(12)]
    finally:
        pool.close()
    assert len({seen[i] for i in range(3)}) == 3
    assert sum(1 for name in seen.values() if name.startswith("corral-sample")) >= 2


def test_width_follows_the_cap_and_the_items() -> None:
    pool = SamplePool(4)
    assert pool.width(1) == 1 and pool.width(3) == 3 and pool.width(32) == 4
    pool.cap = 2
    assert pool.width(32) == 2
    names: set[str] = set()

    def work(i: int) -> int:
        names.add(threading.current_thread().name)
        return i

    pool.cap = 1  # the governor finds one free core: everything on the caller's thread
    assert pool.map(work, list(range(8))) == list(range(8))
    assert names == {threading.current_thread().name}
    pool.close()


def test_an_exception_in_a_pool_thread_reaches_the_caller() -> None:
    pool = SamplePool(2)
    raised = threading.Event()

    def work(i: int) -> int:
        if threading.current_thread().name.startswith("corral-sample"):
            raised.set()
            raise ValueError("boom")
        assert raised.wait(10)  # the caller's thread leaves the other items to the pool thread
        return i

    with pytest.raises(ValueError, match="boom"):
        pool.map(work, list(range(6)))
    pool.close()


def test_auto_and_explicit_sizes() -> None:
    assert resolve_sampling_threads("auto", offloaded=False, n_parallel=32, n_cpus=16) == AUTO_CPU_MAX
    assert resolve_sampling_threads("auto", offloaded=False, n_parallel=8, n_cpus=2) == 2
    assert resolve_sampling_threads("auto", offloaded=False, n_parallel=1, n_cpus=2) == 1
    assert resolve_sampling_threads("auto", offloaded=True, n_parallel=32, n_cpus=16) == AUTO_GPU_MAX
    assert resolve_sampling_threads("auto", offloaded=True, n_parallel=4, n_cpus=16) == 4
    assert resolve_sampling_threads("auto", offloaded=True, n_parallel=32, n_cpus=2) == 2
    assert resolve_sampling_threads(3, offloaded=False, n_parallel=32, n_cpus=2) == 3  # as configured
    assert resolve_sampling_threads(6, offloaded=False, n_parallel=4, n_cpus=2) == 4  # never more than slots


def test_the_setting_is_checked() -> None:
    assert ModelSettings().sampling_threads == "auto"
    assert ModelSettings.check_partial({"sampling_threads": 4}) == {"sampling_threads": 4}
    assert ModelSettings.check_partial({"sampling_threads": "auto"}) == {"sampling_threads": "auto"}
    for bad in (0, "many", 1000):
        with pytest.raises(SettingsError, match="sampling_threads"):
            ModelSettings.check_partial({"sampling_threads": bad})


def test_governor_reports_free_cores_uncapped_by_decode_threads() -> None:
    t = [0.0]
    counters = [0.0, 0.0]

    def read() -> tuple[float, float]:
        return counters[0], counters[1]

    from corral.worker.host import cpu
    runnable = [3]
    g = ThreadGovernor(2, lambda n: None, n_cpus=8, read=read, clock=lambda: t[0], running=lambda: runnable[0],
                       niced=False)
    assert g.free_cores == 8
    t[0] += 1.0
    counters[0] += 3.0 * cpu._TICK  # three cores busy, one of them ours
    counters[1] += 1.0 * cpu._TICK
    g.tick()
    assert g.free_cores == 6 and g.current == 2
    g.wake()  # three threads runnable now, one of them ours
    assert g.free_cores == 6
    runnable[0] = 1  # only ours: waking takes the cores back at once (it never lowers them)
    g.wake()
    assert g.free_cores == 8 and g.current == 2


def test_auto_counts_layers_as_offloaded_only_with_a_gpu_present() -> None:
    from corral import wire
    from corral.worker.sampling.pool import pool_for

    def info(gpu_layers: int, kinds: list[str]) -> wire.ModelInfo:
        devs = [wire.DeviceInfo(index=i, name=f"D{i}", backend="X", kind=k, free_bytes=1, total_bytes=1)
                for i, k in enumerate(kinds)]
        return wire.ModelInfo(description="m", n_params=1, n_vocab=1, n_ctx_train=1, n_ctx=32 * 16,
                              n_ctx_slot=16, n_slots=32, n_embd=1, embedding=False, has_chat_template=False,
                              model_bytes=1, kv_bytes=1, rss_bytes=1, gpu_layers=gpu_layers, load_ms=1.0,
                              devices=devs)

    cpu_auto = min(AUTO_CPU_MAX, len(os.sched_getaffinity(0)))
    assert pool_for("auto", info(999, ["cpu"])).n == cpu_auto  # -ngl 999 on a machine without a GPU
    assert pool_for("auto", info(0, ["cpu", "gpu"])).n == cpu_auto
    with_gpu = pool_for("auto", info(999, ["cpu", "gpu"])).n
    assert with_gpu == max(1, min(32, len(os.sched_getaffinity(0)), AUTO_GPU_MAX))
    assert pool_for(2, info(0, ["cpu"])).n == 2
