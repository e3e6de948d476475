"""Prefix reuse under sliding-window attention, and embeddings."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from corral import wire
from corral.worker.engine import Engine
from corral.worker.slots import reuse_len

from .conftest import run_engine, settings_for, REUSED_TAIL

pytestmark = pytest.mark.integration


SHORT = "The lighthouse keeper wrote in his journal every night."
GREEDY8 = wire.SamplingParams(max_tokens=8, temperature=0.0)


def _short_then_long(e: Engine, entries: int) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """SHORT alone, then a prompt that starts with it and goes on for ``entries`` lines: the
    short one's texts and finals, and the long one's finals."""
    long_text = SHORT + " " + " ".join(f"Entry {i}: the sea was calm." for i in range(entries))
    fresh, f1, _ = run_engine(e, [wire.GenerateRequest(id="short1", prompt=SHORT, params=GREEDY8)])
    _, f2, _ = run_engine(e, [wire.GenerateRequest(id="long", prompt=long_text, params=GREEDY8)])
    return fresh, f1, f2


def test_prefix_reuse_respects_sliding_window(model_path: Path) -> None:
    """Gemma 3 keeps only the last n_swa (512) positions in its sliding-window layers
    (the SWA cache holds n_swa + n_ubatch cells per slot). After a sequence grew past
    that, a prefix whose window is gone must be recomputed, never reused."""
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=2048, n_batch=256))
    try:
        assert e.m.n_swa == 512
        fresh, f1, f2 = _short_then_long(e, 150)
        assert f2["long"].usage.prompt_tokens > 1100
        # The long request reused the short prompt (its window was intact).
        assert f2["long"].usage.cached_tokens >= f1["short1"].usage.prompt_tokens - 1
        # The cache now starts well past position 0: the short prefix's window is gone.
        assert reuse_len(e.slots[0], e.tok.tokenize(SHORT, add_special=True), e.m) == 0
        again, f3, _ = run_engine(e, [wire.GenerateRequest(id="short2", prompt=SHORT, params=GREEDY8)])
        assert f3["short2"].usage.cached_tokens == 0
        assert again["short2"] == fresh["short1"]
        # Right after a short request the prefix is reusable again.
        _, f4, _ = run_engine(e, [wire.GenerateRequest(id="short3", prompt=SHORT, params=GREEDY8)])
        assert f4["short3"].usage.cached_tokens == f4["short3"].usage.prompt_tokens - REUSED_TAIL
    finally:
        e.close()


def test_swa_full_reuses_a_prefix_past_the_window(model_path: Path) -> None:
    """With swa_full the sliding-window layers keep every position: after a sequence grew
    past the window, its start is still reusable, and the answer is the fresh one."""
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=2048, n_batch=256, swa_full=True))
    try:
        assert e.m.n_swa == 0  # no cell is dropped: no window to check
        fresh, f1, f2 = _short_then_long(e, 100)
        assert f2["long"].usage.prompt_tokens > 700
        short_tokens = e.tok.tokenize(SHORT, add_special=True)
        assert reuse_len(e.slots[0], short_tokens, e.m) == len(short_tokens) - 1
        again, f3, _ = run_engine(e, [wire.GenerateRequest(id="short2", prompt=SHORT, params=GREEDY8)])
        assert f3["short2"].usage.cached_tokens == len(short_tokens) - 1  # swa_full: no cut
        assert again["short2"] == fresh["short1"]
    finally:
        e.close()


@pytest.fixture(scope="module")
def embedder(model_path: Path):
    e = Engine(settings_for(model_path, embedding=True, n_parallel=2, ctx_len=1024))
    yield e
    e.close()


def test_embeddings_normalized_and_distinct(embedder: Engine) -> None:
    inputs = ["The cat sat on the mat.", "A kitten rested on the rug.", "Quarterly revenue grew 5%.",
              "The cat sat on the mat."]
    _, finals, _ = run_engine(embedder, [wire.EmbedRequest(id="e", inputs=inputs)])
    emb = finals["e"]
    assert isinstance(emb, wire.Embeddings)
    assert len(emb.data) == 4 and all(len(v) == embedder.info.n_embd for v in emb.data)
    for v in emb.data:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    assert emb.data[0] == pytest.approx(emb.data[3], abs=1e-5)  # same text, other batch slot
    assert emb.data[0] != pytest.approx(emb.data[2], abs=1e-3)
    assert emb.prompt_tokens > 12


def test_embeddings_unnormalized_and_refusals(embedder: Engine) -> None:
    _, f, _ = run_engine(embedder, [wire.EmbedRequest(id="raw", inputs=["hello"], normalize=False)])
    norm = math.sqrt(sum(x * x for x in f["raw"].data[0]))
    assert not math.isclose(norm, 1.0, rel_tol=1e-3)
    _, f, _ = run_engine(embedder, [wire.GenerateRequest(id="g", prompt="hi")])
    assert isinstance(f["g"], wire.RequestFailed) and f["g"].code == "invalid_request"
    _, f, _ = run_engine(embedder, [wire.EmbedRequest(id="long", inputs=["word " * 2000])])
    assert f["long"].code == "context_length_exceeded"
    _, f, _ = run_engine(embedder, [wire.EmbedRequest(id="none", inputs=[])])
    assert f["none"].code == "invalid_request"


@pytest.mark.parametrize(("n_parallel", "ctx_len", "swa_full", "mib"),
                         [(4, 4096, False, 72), (2, 8192, False, 54), (2, 8192, True, 144)])
def test_kv_bytes_matches_llama_cpp(model_path: Path, n_parallel: int, ctx_len: int, swa_full: bool,
                                    mib: int) -> None:
    """llama.cpp logs (Gemma 3 270M, f16): 3 full layers x all cells + 15 sliding-window
    layers x min(slot cells, 512 + 512) per slot: 12 + 60 MiB and 24 + 30 MiB; with
    swa_full all 18 layers hold every cell: 144 MiB. The router's estimate (fit.plan) agrees."""
    from corral.fit.layout import read_layout
    from corral.fit.plan import device_needs, placement
    from corral.model.settings import ModelSettings
    from corral.worker.model import load_model

    m = load_model(settings_for(model_path, n_parallel=n_parallel, ctx_len=ctx_len, swa_full=swa_full))
    try:
        assert m.info.kv_bytes == mib * 2**20
    finally:
        m.free()
    gpu = wire.DeviceInfo(index=0, name="GPU0", backend="GPU", kind="gpu", free_bytes=1 << 40, total_bytes=1 << 40)

    def kv(full: bool) -> int:
        return sum(d.kv_bytes for d in placement(read_layout(model_path).kv_sized(full), gpus=[gpu], weights=None,
                                                 ngl=-1, ctx=ctx_len, n_slots=n_parallel, n_ubatch=512,
                                                 cache_types=("f16", "f16")))

    def need(full: bool) -> int:
        return device_needs(read_layout(model_path), ModelSettings(n_parallel=n_parallel, ctx_len=ctx_len,
                                                                   swa_full=full, n_gpu_layers=-1), budgets=[1 << 40])[0]

    assert kv(swa_full) == mib * 2**20
    assert need(True) - need(False) == kv(True) - kv(False)  # 0 when a slot holds no more than a window
