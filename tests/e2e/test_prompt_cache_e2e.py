"""The prompt cache across unload, swap and server restart, with the real router, real workers
and the real model: the worker writes its prefixes when it is stopped (PersistCache before
Shutdown), the next worker of the same model restores them, and the greedy answer is the one a
fresh prefill gave; GET /models and /metrics show the hits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.state import cache_files
from support.harness import Harness

pytestmark = pytest.mark.integration

PROMPT = " ".join(f"Rule {i}: the {('red', 'blue', 'green')[i % 3]} stone goes to box {i % 5}." for i in range(24))


def models(model_path: Path, *ids: str) -> dict[str, Any]:
    """One file, ids that are models of their own (not variants): each its own worker."""
    return {i: {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1, "own_instances": True}
            for i in ids}


async def complete(h: Harness, model: str) -> tuple[str, int, int]:
    r = await h.client.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 12,
                                                     "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    u = body["usage"]
    return body["choices"][0]["text"], u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


async def cache_view(h: Harness, model: str) -> dict[str, Any]:
    await h.plane.pools[model].instances[0].fetch_stats()
    r = await h.client.get("/models")
    (entry,) = [m for m in r.json()["data"] if m["id"] == model]
    return entry["instances"][0]["prompt_cache"]


def _files(tmp: Path) -> list[Path]:
    return list((tmp / "state" / "prompt-cache").rglob("*.kv"))


async def test_unload_then_load_restores_from_disk(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    plane = await harness.start(harness.config(models(model_path, "m"), worker_command=None,
                                               state_dir=str(tmp_path / "state")))
    fresh, n_prompt, cached = await complete(harness, "m")
    assert cached == 0
    assert (await harness.client.post("/models/unload", json={"model": "m"})).status_code == 200
    assert len(_files(tmp_path)) == 1  # written before the worker exited
    again, _, cached = await complete(harness, "m")  # autoloads a new worker
    assert cached == n_prompt - 4 and again == fresh  # all but the last cut (worker/prefill.py)
    view = await cache_view(harness, "m")
    assert view["hits"] == 1 and view["disk_hits"] == 1 and view["disk_bytes"] > 0
    metrics = (await harness.client.get("/metrics")).text
    assert 'corral_prompt_cache_disk_hits{instance="0",model="m",node="local"} 1.0' in metrics
    assert plane.pools["m"].instances[0].restarts == 0


async def test_a_swap_keeps_the_prefix(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    await harness.start(harness.config(models(model_path, "m1", "m2"), worker_command=None, max_loaded_models=1,
                                       state_dir=str(tmp_path / "state")))
    fresh, n_prompt, _ = await complete(harness, "m1")
    await harness.client.post("/v1/completions", json={"model": "m2", "prompt": "Hi", "max_tokens": 2})  # m1 out
    again, _, cached = await complete(harness, "m1")  # m2 out, m1 back
    assert cached == n_prompt - 4 and again == fresh  # all but the last cut (worker/prefill.py)
    assert (await cache_view(harness, "m1"))["disk_hits"] == 1


async def test_a_server_restart_keeps_the_prefix(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    cfg = harness.config(models(model_path, "m"), worker_command=None, state_dir=str(tmp_path / "state"))
    await harness.start(cfg)
    fresh, n_prompt, _ = await complete(harness, "m")
    await harness.stop()  # the router's shutdown stops every instance: they write first
    assert len(_files(tmp_path)) == 1
    await harness.start(cfg)
    again, _, cached = await complete(harness, "m")
    assert cached == n_prompt - 4 and again == fresh  # all but the last cut (worker/prefill.py)


async def test_prompt_cache_disk_0_writes_nothing(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    await harness.start(harness.config(models(model_path, "m"), worker_command=None,
                                       state_dir=str(tmp_path / "state"), prompt_cache_disk=0))
    await complete(harness, "m")
    assert (await harness.client.post("/models/unload", json={"model": "m"})).status_code == 200
    assert _files(tmp_path) == [] and cache_files.total_bytes(tmp_path / "state") == (0, 0)
