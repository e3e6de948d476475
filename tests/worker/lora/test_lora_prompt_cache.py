"""The prompt cache of a model with LoRA adapters (worker/cache/prompt_cache.py, worker/lora/adapters.py): its
RAM entries and files are keyed by the adapter set (indices and scales) the cells were
computed under. A prefix computed under one set is restored for a request of that set (the
same greedy tokens) and never for a request of another set (another adapter, another scale,
or none), from RAM and from disk; the files' model key names the adapter files."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from corral.model import settings as cs
from corral import wire
from corral.worker.cache.disk import model_key
from corral.worker.engine import Engine
from testkit.gguf_lora import write_lora
from worker.conftest import run_engine, settings_for, REUSED_TAIL
from worker.cache.test_prompt_cache import LONG, OTHER

GREEDY = wire.SamplingParams(temperature=0.0, max_tokens=12)
A1 = [wire.LoraScale("a", 1.0)]
A_HALF = [wire.LoraScale("a", 0.5)]  # the same adapter at another scale: another set


@pytest.fixture(scope="module")
def adapter(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora(model_path, tmp_path_factory.mktemp("lora-pc") / "a.gguf", seed=11)


def _settings(model_path: Path, adapter: Path, tmp: Path) -> wire.WorkerSettings:
    disk = wire.PromptCacheDisk(dir=str(tmp / "prompt-cache"), max_bytes=1 << 30, write_bytes=1 << 30, write_s=30)
    return settings_for(model_path, n_parallel=1, ctx_len=1024, prompt_cache_disk=disk,
                        lora=[cs.LoraAdapter(id="a", path=str(adapter), scale=0.0)])


def _one(e: Engine, rid: str, prompt: str, lora: list[wire.LoraScale] | None) -> tuple[str, wire.Finished]:
    texts, finals, _ = run_engine(e, [wire.GenerateRequest(id=rid, prompt=prompt, params=GREEDY, lora=lora)])
    fin = finals[rid]
    assert isinstance(fin, wire.Finished), fin
    return texts.get(rid, ""), fin


def test_a_prefix_is_restored_only_for_its_own_adapter_set(model_path: Path, adapter: Path, tmp_path: Path) -> None:
    s = _settings(model_path, adapter, tmp_path)
    e = Engine(s)
    try:
        assert e.prompt_cache.enabled
        fresh_a, f1 = _one(e, "a1", LONG, A1)
        assert f1.usage.cached_tokens == 0 and f1.usage.prompt_tokens >= 150
        # the reference: the prefix reused in its slot, so the last prompt token decodes alone as
        # after a restore (this CPU's kernels round a batch of one differently from the whole
        # prompt: under this adapter enough to flip a near tie; the same cells give the same tokens)
        reused_a, f0 = _one(e, "a0", LONG, A1)
        assert f0.usage.cached_tokens == f0.usage.prompt_tokens - REUSED_TAIL
        _one(e, "o1", OTHER, None)  # the one slot now holds OTHER (no adapter); LONG under "a" went to RAM
        # LONG without the adapter: the entry of set "a" must not serve it
        fresh_base, f2 = _one(e, "b1", LONG, None)
        assert f2.usage.cached_tokens < 16 and e.prompt_cache.stats().hits == 0
        assert fresh_base not in (fresh_a, reused_a)  # the adapter changes the answer
        # LONG under "a" again (the slot holds LONG without it, a set of 0 tokens for this job):
        # its own entry is restored, with the same greedy tokens
        again, f3 = _one(e, "a2", LONG, A1)
        assert f3.usage.cached_tokens == f3.usage.prompt_tokens - REUSED_TAIL
        assert again == reused_a
        st = e.prompt_cache.stats()
        assert st.hits == 1 and st.restored_tokens == f3.usage.cached_tokens
        keys = {(len(x.tokens), x.lora) for x in e.prompt_cache.store.entries() if not x.pinned}
        n = f1.usage.prompt_tokens - REUSED_TAIL  # entries cut back to the prompt less its last cut
        assert (n, ((0, 1.0),)) in keys and (n, ()) in keys
        e.prompt_cache.persist(e.slots, wire.PersistCache())
    finally:
        e.close()
    e = Engine(s)  # a new worker: the files, keyed by set too
    try:
        assert {f.lora for f in e.prompt_cache.disk.entries()} == {(), ((0, 1.0),)}  # type: ignore[union-attr]
        _, f4 = _one(e, "h1", LONG, A_HALF)  # the same adapter at 0.5: no file serves it
        assert f4.usage.cached_tokens == 0 and e.prompt_cache.stats().hits == 0
        from_disk, f5 = _one(e, "a3", LONG, A1)
        assert f5.usage.cached_tokens == f5.usage.prompt_tokens - REUSED_TAIL and e.prompt_cache.stats().disk_hits == 1
        assert from_disk == reused_a
        # the files' key names the adapter files: a replaced (here: touched) adapter is another key
        key = model_key(e.m, s)
        st = os.stat(adapter)
        os.utime(adapter, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        assert model_key(e.m, s) != key
        assert model_key(e.m, msgspec.structs.replace(s, lora=[])) not in (key, model_key(e.m, s))
    finally:
        e.close()
