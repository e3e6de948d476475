"""The host-RAM KV store (worker/cache/kv_store.py): its LRU and pins, and a real sequence's
state saved, cleared and restored under another seq id, continuing as if never moved."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as ll
import pytest

from corral import wire
from corral.worker.cache.kv_store import HostKVStore, common_prefix, restore_seq, save_seq
from worker.conftest import run_engine, settings_for

GREEDY = wire.SamplingParams(temperature=0.0, max_tokens=12)


def test_lru_evicts_cache_entries_never_pinned_ones() -> None:
    s = HostKVStore(100)
    assert s.put("a", [1, 2, 3], b"x" * 40)
    assert s.put("p", [9], b"y" * 40, pinned=True)
    assert s.put("b", [1, 2, 4], b"z" * 40)  # evicts a, the least recently used cache entry
    assert "a" not in s and "p" in s and "b" in s and s.bytes_used == 80 and s.evictions == 1
    assert not s.put("q", [7], b"w" * 70, pinned=True)  # cannot fit beside the pinned 40
    assert "b" in s and "q" not in s  # a refused put evicts nothing it did not need
    assert s.put("q", [7], b"w" * 60, pinned=True) and "b" not in s
    assert s.longest_prefix([9, 1]) is None  # pinned entries never serve as cache
    assert s.pop("p") is not None and s.bytes_used == 60


def test_longest_prefix_and_touch() -> None:
    s = HostKVStore(1000)
    s.put("short", [1, 2], b"a" * 10)
    s.put("long", [1, 2, 3, 4], b"b" * 20)
    hit = s.longest_prefix([1, 2, 3, 9])
    assert hit is not None and hit[0].key == "long" and hit[1] == 3
    assert s.longest_prefix([5]) is None and common_prefix([1, 2], [1, 3]) == 1
    s.get("short")
    assert [e.key for e in s.entries()] == ["long", "short"]


def test_a_saved_sequence_restores_into_another_slot_and_continues_the_same(model_path: Path) -> None:
    from corral.worker.engine import Engine

    e = Engine(settings_for(model_path, n_parallel=2, ctx_len=1024))
    try:
        prompt = "The history of the city begins with a small port on the river, where"
        base, _, _ = run_engine(e, [wire.GenerateRequest(id="a", prompt=prompt, params=GREEDY)])
        slot = next(s for s in e.slots if s.cached)
        state = save_seq(e.m.ctx, slot.index)
        assert state
        cached = list(slot.cached)
        other = e.slots[1 - slot.index]
        ll.llama_memory_seq_rm(e.m.memory, slot.index, -1, -1)
        slot.cached = []
        ll.llama_memory_seq_rm(e.m.memory, other.index, -1, -1)
        other.cached = []
        assert restore_seq(e.m.ctx, other.index, state)
        assert ll.llama_memory_seq_pos_max(e.m.memory, other.index) == len(cached) - 1
        other.cached = cached
        again, finals, _ = run_engine(e, [wire.GenerateRequest(id="b", prompt=prompt, params=GREEDY)])
        fin = finals["b"]
        assert isinstance(fin, wire.Finished) and fin.slot == other.index
        assert fin.usage.cached_tokens > 0  # served from the restored cells
        assert again["b"] == base["a"]
        assert not restore_seq(e.m.ctx, 0, b"")
    finally:
        e.close()


@pytest.mark.parametrize("junk", [b"\x00" * 64, b"not a state"])
def test_a_foreign_state_is_refused_not_crashed(model_path: Path, junk: bytes) -> None:
    from corral.worker.engine import Engine

    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=256))
    try:
        assert not restore_seq(e.m.ctx, 0, junk)
    finally:
        e.close()
