"""The prompt cache (worker/cache/prompt_cache.py, worker/cache/disk.py, corral/state/cache_files.py) on the
real engine: a restored prefix answers with the same greedy tokens as a fresh prefill, from RAM
after a slot lost it, from disk in a new engine, in the sliding-window case too; a stale or
damaged file is never restored and the request still answers; the disk cap holds.

Greedy only: a restored prefix decodes just the last prompt token, in a batch of one, and this
machine's CPU kernels give slightly different logits for a batch of one than for a whole prompt
(tests/worker/test_engine.py's prefix reuse test): enough to flip a seeded draw, not the greedy
choice over these prompts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from corral import wire

from corral.state import cache_files
from corral.worker.engine import Engine
from worker.conftest import run_engine, settings_for, REUSED_TAIL

GREEDY = wire.SamplingParams(temperature=0.0, max_tokens=12)
LONG = " ".join(f"Rule {i}: the {('red', 'blue', 'green')[i % 3]} stone goes to box {i % 5}." for i in range(24))
OTHER = " ".join(f"Note {i}: nothing about stones at all, only weather {i}." for i in range(12))


def _gen(rid: str, prompt: str) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, params=GREEDY)


def _one(e: Engine, rid: str, prompt: str) -> tuple[str, wire.Finished]:
    texts, finals, _ = run_engine(e, [_gen(rid, prompt)])
    fin = finals[rid]
    assert isinstance(fin, wire.Finished), fin
    return texts.get(rid, ""), fin


def _disk(tmp: Path, max_bytes: int = 1 << 30) -> wire.PromptCacheDisk:
    return wire.PromptCacheDisk(dir=str(tmp / "prompt-cache"), max_bytes=max_bytes, write_bytes=1 << 30, write_s=30)


def _engine(model: Path, tmp: Path | None = None, **kw: object) -> Engine:
    base: dict[str, object] = dict(n_parallel=1, ctx_len=1024)
    base.update(kw)
    if tmp is not None:
        base["prompt_cache_disk"] = _disk(tmp)
    return Engine(settings_for(model, **base))


def test_a_prefix_evicted_from_its_slot_is_restored_from_ram(model_path: Path) -> None:
    e = _engine(model_path)
    try:
        fresh, f1 = _one(e, "a", LONG)
        assert f1.usage.cached_tokens == 0 and f1.usage.prompt_tokens >= 150
        _one(e, "b", OTHER)  # the one slot's cache now holds OTHER; LONG went to RAM
        st = e.prompt_cache.stats()
        assert st.saves == 1 and st.ram_entries == 1 and st.ram_bytes > 0
        again, f3 = _one(e, "c", LONG)
        assert f3.usage.cached_tokens == f3.usage.prompt_tokens - REUSED_TAIL  # restored, the last 4 tokens decoded
        assert again == fresh
        st = e.prompt_cache.stats()
        assert st.hits == 1 and st.disk_hits == 0 and st.restored_tokens == f3.usage.cached_tokens
        # a prompt that extends the saved one is served its whole prefix too (Gemma 3 slides a
        # window: the entry was cut back to the last prompt less one token before saving)
        _one(e, "d", OTHER)
        _, f5 = _one(e, "e", LONG + " Rule 99:")
        assert f5.usage.cached_tokens >= f1.usage.prompt_tokens - REUSED_TAIL
    finally:
        e.close()


def test_sliding_window_restores_only_a_whole_window(model_path: Path) -> None:
    # n_batch 64: the SWA layers keep n_swa (512) + 64 cells per slot, so a ~700-token prompt's
    # state starts past position 0 (pos_min > 0)
    long = " ".join([LONG] * 4)
    e = _engine(model_path, n_batch=64, ctx_len=2048)
    try:
        assert e.m.n_swa > 0
        fresh, f1 = _one(e, "a", long)
        n = f1.usage.prompt_tokens
        assert n > 512 + 64 + 64
        _one(e, "b", OTHER)
        entry = next(iter(e.prompt_cache.store.entries()))
        assert entry.pos_min > 0  # the window: the state holds positions pos_min.. only
        again, f3 = _one(e, "c", long)
        assert f3.usage.cached_tokens == n - REUSED_TAIL and again == fresh
        # a prompt that leaves the saved one before pos_min + n_swa: that prefix's window is
        # gone, so nothing is restored (it prefills)
        _one(e, "d", OTHER)
        hits = e.prompt_cache.stats().hits
        early = LONG[:300] + " Something else entirely, about birds and their songs in the morning." * 4
        _, f5 = _one(e, "e", early)
        assert e.prompt_cache.stats().hits == hits and f5.usage.cached_tokens < 64
    finally:
        e.close()


def test_a_new_engine_restores_from_disk_what_the_last_one_wrote(model_path: Path, tmp_path: Path) -> None:
    e = _engine(model_path, tmp_path)
    try:
        fresh, f1 = _one(e, "a", LONG)
        written, n_bytes = e.prompt_cache.persist(e.slots, wire.PersistCache())
        assert written == 1 and n_bytes > 0
    finally:
        e.close()
    files = list((tmp_path / "prompt-cache").rglob("*.kv"))
    assert len(files) == 1 and not list((tmp_path / "prompt-cache").rglob(".tmp-*"))
    e = _engine(model_path, tmp_path)
    try:
        assert e.prompt_cache.stats().disk_entries == 1
        again, f2 = _one(e, "b", LONG)
        assert f2.usage.cached_tokens == f2.usage.prompt_tokens - REUSED_TAIL and again == fresh
        st = e.prompt_cache.stats()
        assert st.hits == 1 and st.disk_hits == 1
    finally:
        e.close()


def _write_one(model_path: Path, tmp_path: Path, **kw: object) -> str:
    e = _engine(model_path, tmp_path, **kw)
    try:
        text, _ = _one(e, "a", LONG)
        assert e.prompt_cache.persist(e.slots, wire.PersistCache())[0] == 1
        return text
    finally:
        e.close()


@pytest.mark.parametrize("change", [{"cache_type_k": "q8_0"}, {"ctx_len": 2048}, {"n_parallel": 2}, "file"])
def test_a_stale_entry_is_never_restored(model_path: Path, tmp_path: Path, change: object) -> None:
    model = tmp_path / "m.gguf"
    shutil.copyfile(model_path, model)
    _write_one(model, tmp_path)
    kw: dict[str, object] = {}
    if change == "file":  # same bytes, touched: another file as far as the key knows
        st = model.stat()
        os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    else:
        assert isinstance(change, dict)
        kw = change
    e = _engine(model, tmp_path, **kw)
    try:
        assert e.prompt_cache.stats().disk_entries == 0  # another key: another directory
        _, fin = _one(e, "b", LONG)
        assert fin.usage.cached_tokens == 0 and e.prompt_cache.stats().hits == 0
    finally:
        e.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign_key"])
def test_a_damaged_file_is_refused_and_the_request_prefills(model_path: Path, tmp_path: Path, damage: str) -> None:
    fresh = _write_one(model_path, tmp_path)
    (path,) = list((tmp_path / "prompt-cache").rglob("*.kv"))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40  # inside the KV state: only the checksum sees it
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) - 1000]))
    else:  # a header naming another key, its checksum made right again
        import hashlib
        entry = cache_files.read_header(path)
        body = bytes(data[:-32]).replace(entry.model_key.encode(), b"0" * len(entry.model_key))
        path.write_bytes(body + hashlib.sha256(body).digest())
    e = _engine(model_path, tmp_path)
    try:
        text, fin = _one(e, "b", LONG)
        assert text == fresh and fin.usage.cached_tokens == 0
        st = e.prompt_cache.stats()
        assert st.hits == 0 and st.refused_files == 1 and not path.exists()
    finally:
        e.close()


def test_the_disk_cap_holds_under_a_burst_of_long_prompts(model_path: Path, tmp_path: Path) -> None:
    e = _engine(model_path, tmp_path, n_parallel=2, ctx_len=1024)
    try:
        _one(e, "p0", LONG)
        one_file = e.prompt_cache.persist(e.slots, wire.PersistCache())[1]
        cap = int(one_file * 2.5)  # room for two entries
        e.prompt_cache.disk.cfg = _disk(tmp_path, cap)  # type: ignore[union-attr]
        for i in range(1, 6):
            run_engine(e, [_gen(f"p{i}a", f"Burst {i}. " + LONG), _gen(f"p{i}b", f"Other {i}. " + LONG)])
            e.prompt_cache.persist(e.slots, wire.PersistCache())
            n_files, n_bytes = cache_files.total_bytes(tmp_path / "prompt-cache")
            assert n_bytes <= cap and n_files <= 2
        # the newest entries are the ones kept
        kept = {f.tokens for f in e.prompt_cache.disk.entries()}  # type: ignore[union-attr]
        assert {tuple(s.cached) for s in e.slots} == kept
    finally:
        e.close()


def test_sliding_window_prefix_from_disk_in_a_new_engine(model_path: Path, tmp_path: Path) -> None:
    long = " ".join([LONG] * 4)
    kw: dict[str, object] = dict(n_batch=64, ctx_len=2048)
    e = _engine(model_path, tmp_path, **kw)
    try:
        fresh, f1 = _one(e, "a", long)
        assert e.prompt_cache.persist(e.slots, wire.PersistCache())[0] == 1
    finally:
        e.close()
    (entry,) = [f for f in cache_files.scan(tmp_path / "prompt-cache") if isinstance(f, cache_files.CacheFile)]
    assert entry.pos_min > 0 and entry.n_tokens == f1.usage.prompt_tokens - REUSED_TAIL  # cut back to the prompt
    e = _engine(model_path, tmp_path, **kw)
    try:
        again, f2 = _one(e, "b", long)
        assert f2.usage.cached_tokens == f2.usage.prompt_tokens - REUSED_TAIL and again == fresh
        assert e.prompt_cache.stats().disk_hits == 1
    finally:
        e.close()


def test_a_write_is_bounded_in_bytes_and_time(tmp_path: Path) -> None:
    from corral.worker.cache.disk import Candidate, DiskCache

    disk = DiskCache(_disk(tmp_path), "k" * 64, "m")
    cands = [Candidate(tuple(range(i, i + 100)), 0, bytes(10_000), float(i)) for i in range(5)]
    assert disk.persist(cands, 1 << 30, timeout_s=0.0) == (0, 0)  # out of time: nothing written
    written, n_bytes = disk.persist(cands, 25_000, timeout_s=30.0)
    assert written == 2 and n_bytes <= 25_000 + 2 * 1000  # two fit the budget: the most recent two
    assert {f.tokens[0] for f in disk.entries()} == {4, 3}


def test_the_file_identity_uses_the_stores_sha256_where_it_has_one(tmp_path: Path) -> None:
    import json

    from corral.worker.cache.disk import file_identity

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(5000))
    loose = file_identity(str(model))
    assert "mtime_ns" in loose and "sha256" not in loose
    mdir = tmp_path / ".corral" / "manifests"
    mdir.mkdir(parents=True)
    sha = "ab" * 32
    (mdir / "m.json").write_text(json.dumps({"id": "m", "path": str(model), "sha256": sha, "size": 5004}))
    pulled = file_identity(str(model))
    assert pulled["sha256"] == sha and "mtime_ns" not in pulled
    assert pulled["head_tail_sha256"] == loose["head_tail_sha256"]
    model.write_bytes(b"GGUF" + bytes(5001))  # replaced by hand: the manifest's size no longer holds
    assert "sha256" not in file_identity(str(model))
