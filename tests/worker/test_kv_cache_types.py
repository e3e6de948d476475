"""KV cache types (cache_type_k / cache_type_v, llama-server's --cache-type-k/-v): the real
engine with a q8_0 cache, what it reports and what llama.cpp really holds."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as ll
import pytest

from corral import wire
from corral.config import config_from_dict
from corral.errors import ConfigError
from corral.worker.engine import Engine

from .conftest import run_engine, settings_for

pytestmark = pytest.mark.integration


def test_a_q8_0_cache_holds_the_same_tokens_in_about_half_the_memory(model_path: Path) -> None:
    held, reported = {}, {}
    for t in ("f16", "q8_0"):
        e = Engine(settings_for(model_path, n_parallel=1, ctx_len=1024, cache_type_k=t, cache_type_v=t))
        try:
            req = wire.GenerateRequest(id=t, prompt="The history of the Roman empire begins",
                                       params=wire.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
            texts, finals, _ = run_engine(e, [req])
            fin = finals[t]
            assert isinstance(fin, wire.Finished) and fin.usage.completion_tokens == 16 and texts[t].strip()
            held[t] = ll.llama_state_seq_get_size(e.m.ctx, 0)  # the slot keeps its tokens for reuse
            reported[t] = e.info.kv_bytes
            # what corral computes is what llama.cpp allocated (its log prints MiB to 2 decimals)
            logged = sum(b.bytes for b in e.info.buffers if b.kind == "kv")
            [host] = e.info.placement
            assert logged > 0 and abs(host.kv_bytes - logged) < 16 * 1024 and abs(e.info.kv_bytes - logged) < 16 * 1024
            assert any(b.kind == "model" for b in e.info.buffers) and any(b.kind == "compute" for b in e.info.buffers)
        finally:
            e.close()
    # Gemma's heads are 256 wide: a row is 512 bytes in f16, 8 blocks of 34 bytes in q8_0
    assert reported["q8_0"] * 512 == reported["f16"] * 272
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
