"""Where the weights load on the CPU. ggml's extra buffer types (its repacked CPU_REPACK
buffer, its AMX buffer) are used where they are safe; where ggml's AMX buffer would take the
weights (``devices.ggml_amx``: a build with AMX on a CPU with it), its matrix product crashes at
the first decode (SIGSEGV in ``ggml_backend_amx_mul_mat``, seen on a Xeon with AMX), so the model
loads in plain CPU buffers there, as llama-server's ``--no-repack``."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import wire
from corral.worker import llama_context
from corral.worker.engine import Engine

from .conftest import run_engine, settings_for

pytestmark = pytest.mark.integration

_EXTRA = {"AMX", "CPU_REPACK"}  # ggml's extra buffer types on x86


def test_where_ggml_would_use_amx_the_weights_load_in_plain_buffers_and_decode(model_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the guard this decode is the crash on an AMX machine; elsewhere the weights
    would show a CPU_REPACK buffer."""
    monkeypatch.setattr(llama_context, "ggml_amx", lambda: True)
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=512, n_gpu_layers=0))
    try:
        weights = {b.buffer for b in e.info.buffers if b.kind == "model"}
        assert weights and not weights & _EXTRA, e.info.buffers
        req = wire.GenerateRequest(id="a", prompt="The capital of France is",
                                   params=wire.SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        texts, finals, _ = run_engine(e, [req])
        fin = finals["a"]
        assert isinstance(fin, wire.Finished) and fin.usage.completion_tokens == 4 and texts["a"]
    finally:
        e.close()


def test_the_extra_buffer_types_stay_on_where_amx_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llama_context, "ggml_amx", lambda: False)
    p = llama_context.model_params(7)
    assert p.use_extra_bufts and p.n_gpu_layers == 7
    monkeypatch.setattr(llama_context, "ggml_amx", lambda: True)
    assert not llama_context.model_params(7).use_extra_bufts
