"""A draft model on the router side: its memory in an instance's GPU need (corral.fit.draft,
control/placement/gpus.py), and which method speculates in GET /models and /metrics."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from corral import wire
from corral.fit.rows import outputs_max
from corral.control.catalog import ModelSpec
from corral.control.placement.gpus import _need
from corral.control.metrics import Metrics
from corral.control.views import speculation
from corral.fit.draft import draft_needs, draft_path, draft_settings
from corral.fit.layout import read_layout
from corral.model.settings import ModelSettings, SettingsError


def _stats() -> wire.Stats:
    return wire.Stats(slots_busy=0, slots_total=4, waiting=0, rss_bytes=1, model_bytes=1, kv_bytes=1,
                      tokens_generated=300, tokens_prompt=10, spec_drafted=200, spec_accepted=150, gen_steps=120)


def _spec(model_path: Path, **kw: object) -> ModelSpec:
    return ModelSpec.make("m", model_path, ModelSettings(**kw), source="config")  # type: ignore[arg-type]


def test_a_draft_model_needs_its_path() -> None:
    with pytest.raises(SettingsError, match="draft_model"):
        ModelSettings.layered([{"speculative": "draft"}])
    s = ModelSettings.layered([{"speculative": "draft", "draft_model": "small.gguf"}])
    assert draft_path(s, "/models/big.gguf") == Path("/models/small.gguf")  # relative: the model's folder
    assert draft_path(s.settings(), "/x/big.gguf") == Path("/x/small.gguf")
    assert draft_path(ModelSettings(draft_model="/abs/d.gguf"), "/x/big.gguf") is None  # speculative off
    assert draft_settings(s).n_gpu_layers == -1 and draft_settings(ModelSettings(n_gpu_layers=0)).n_gpu_layers == 0


def test_the_gpu_need_adds_the_draft_models(model_path: Path) -> None:
    budgets, free = [8 << 30], [8 << 30]
    plain = _spec(model_path, n_gpu_layers=-1, ctx_len=2048, n_parallel=4)  # slots set: the rows are counted
    drafted = _spec(model_path, n_gpu_layers=-1, ctx_len=2048, n_parallel=4, speculative="draft",
                    draft_model=str(model_path))
    own = _need(SimpleNamespace(spec=plain), budgets, free)  # type: ignore[arg-type]
    both = _need(SimpleNamespace(spec=drafted), budgets, free)  # type: ignore[arg-type]
    assert own[0] > 100 << 20
    # the same file as its own draft, all layers on the GPU: twice the need, and the main
    # context's logits rows for the drafts it verifies (fit.rows.outputs_max)
    drafts_rows = outputs_max(drafted, drafted.n_parallel) - outputs_max(plain, plain.n_parallel)
    assert drafts_rows == drafted.n_parallel * drafted.draft_max
    assert both == [2 * own[0] + 4 * read_layout(model_path).n_vocab * drafts_rows]
    assert draft_needs(drafted, model_path, budgets=budgets) == own
    cpu_draft = _spec(model_path, n_gpu_layers=-1, speculative="draft", draft_model=str(model_path), draft_n_gpu_layers=0)
    assert draft_needs(cpu_draft, model_path, budgets=budgets)[0] < own[0] // 4  # no weights there, only buffers


def test_views_and_metrics_say_which_method() -> None:
    info = SimpleNamespace(draft=wire.DraftInfo(path="/m/d.gguf", description="d", n_params=1, model_bytes=2,
                                                kv_bytes=3, gpu_layers=0, n_ctx=16))
    v = speculation(_stats(), "draft", info)  # type: ignore[arg-type]
    assert v is not None and v["method"] == "draft" and v["draft_model"] == "/m/d.gguf"
    assert v["acceptance_rate"] == 0.75 and v["tokens_per_step"] == 2.5
    m = Metrics()
    insts = [{"index": k, "state": "ready", "busy": 0, "total": 4, "memory": None, "node": "local", "node_address": "",
              "speculation": speculation(_stats(), method)} for k, method in enumerate(("draft", "off"))]
    m.watch(lambda: [{"id": "m", "status": "loaded", "queued": 0, "instances": insts}])
    text = m.render().decode()
    assert 'corral_spec_method{instance="0",method="draft",model="m",node="local"} 1.0' in text
    assert 'method="off"' not in text
    assert 'corral_spec_acceptance_rate{instance="0",model="m",node="local"} 0.75' in text
