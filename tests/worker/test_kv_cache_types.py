"""KV cache types (cache_type_k / cache_type_v, llama-server's --cache-type-k/-v): the real
engine with a q8_0 cache, what it reports and what llama.cpp really holds."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as ll
import pytest

from corral import wire
from corral.config.file import config_from_dict
from corral.errors import ConfigError
from corral.worker.engine import Engine

from .conftest import run_engine, settings_for

pytestmark = pytest.mark.integration


def test_a_q8_0_cache_holds_the_same_tokens_in_about_half_the_memory(model_path: Path) -> None:
    """3000 cells over 2 slots: llama.cpp pads each slot's 1500 to 1536 cells, and keeps
    min(1536, 512 + 512) of them (padded to 256) in the sliding-window layers; corral's
    computed KV (the host entry of ``placement``) must be what it logged allocating."""
    held, computed = {}, {}
    for t in ("f16", "q8_0"):
        e = Engine(settings_for(model_path, n_parallel=2, ctx_len=3000, n_gpu_layers=0, cache_type_k=t,
                                cache_type_v=t))
        try:
            req = wire.GenerateRequest(id=t, prompt="The history of the Roman empire begins",
                                       params=wire.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
            texts, finals, _ = run_engine(e, [req])
            fin = finals[t]
            assert isinstance(fin, wire.Finished) and fin.usage.completion_tokens == 16 and texts[t].strip()
            held[t] = sum(ll.llama_state_seq_get_size(e.m.ctx, k) for k in range(2))  # kept for prefix reuse
            logged = sum(b.bytes for b in e.info.buffers if b.kind == "kv")
            [host] = e.info.placement
            computed[t] = host.kv_bytes
            assert logged > 0 and abs(host.kv_bytes - logged) < 16 * 1024, (host.kv_bytes, logged)
            assert e.info.kv_bytes == logged  # the reported size is llama.cpp's own
            assert any(b.kind == "model" for b in e.info.buffers) and any(b.kind == "compute" for b in e.info.buffers)
        finally:
            e.close()
    # Gemma's heads are 256 wide: a row is 512 bytes in f16, 8 blocks of 34 bytes in q8_0
    assert computed["q8_0"] * 512 == computed["f16"] * 272
    assert 0.45 < held["q8_0"] / held["f16"] < 0.6  # llama.cpp really stores it so


@pytest.mark.parametrize(("table", "why"), [
    ({"cache_type_v": "q4_0", "flash_attn": False},
     "[models.m] key 'cache_type_v': q4_0 (a quantized V cache) needs flash attention: leave flash_attn unset"),
    ({"cache_type_k": "q3_k"}, "[models.m] key 'cache_type_k': Invalid enum value 'q3_k' (allowed: f16, f32, bf16, "
                               "q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1)"),
    ({"n_gpu_layers": "most"}, "[models.m] key 'n_gpu_layers': Invalid enum value 'most' (allowed: auto, or a number)"),
])
def test_cache_types_are_checked_when_the_config_is_read(tmp_path: Path, table: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError) as ei:
        config_from_dict({"models": {"m": {"path": str(tmp_path / "m.gguf"), **table}}})
    assert why in str(ei.value)
    assert config_from_dict({"models": {"m": {"path": str(tmp_path / "m.gguf"), "cache_type_k": "q8_0",
                                              "cache_type_v": "q8_0", "flash_attn": True}}})
