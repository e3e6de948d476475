"""Draft-model speculation (worker/speculation/draft.py) with the real engine and model.

The embedded Gemma as its own draft: acceptance near 100% with greedy sampling, the texts
equal those without speculation except where the model's margin at the parting token lies
inside the batch-shape noise (measured as in test_speculation.py), over 8 prompts on 4 slots
with grammar-constrained requests among them. Sampled: the tokens follow the target
distribution (a two-sample chi-square test over a top-4 slice, fixed seeds). A tiny random
draft with the same vocabulary (testkit/draft_models.py): most drafts fail, the text is
still the model's own. A draft with another vocabulary is refused at load.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from corral import wire
from corral.worker.speculation.draft import DraftSpeculator, main_settings
from corral.worker.engine import Engine
from corral.worker.llama_context import captured
from corral.worker.model import ModelLoadError
from corral.worker.slots import Slot
from corral.worker.speculation.speculator import CPU_TOKEN_COST
from testkit.draft_models import write_tiny_draft
from testkit.gguf_models import write_reranker
from worker.conftest import run_engine, settings_for
from worker.speculation import test_speculation
from worker.speculation.test_speculation import (PROMPTS, _greedy_requests, check_parting,
                                                 check_sampled_follows_target)

plain, noise = test_speculation.plain, test_speculation.noise  # the same engine fixtures (one each here)


@pytest.fixture(scope="module")
def tiny_drafts(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random draft with the model's vocabulary, and one with a token renamed."""
    d = tmp_path_factory.mktemp("drafts")
    return (write_tiny_draft(model_path, d / "tiny.gguf"),
            write_tiny_draft(model_path, d / "renamed.gguf", rename=(70001,)))


@pytest.fixture(scope="module")
def selfdraft(model_path: Path) -> Iterator[Engine]:
    e = Engine(settings_for(model_path, speculative="draft", draft_model=str(model_path), n_parallel=4,
                            ctx_len=4096, draft_max=8))
    # the model as its own draft costs a whole decode a draft token, so the measured costs would
    # stop it drafting (worker/speculation/cost.py): these tests check what its drafts give, with the
    # draft's cost taken as 0 (the rule itself: tests/worker/speculation/test_spec_cost.py)
    e.spec.costs.fixed = (CPU_TOKEN_COST, 0.0)
    yield e
    e.close()


def _requests() -> list[wire.GenerateRequest]:
    """8 of test_speculation's greedy requests (one past the sliding window, both grammars),
    shorter: a self-draft doubles the work on a CPU."""
    reqs = {r.id: r for r in _greedy_requests()}
    keep = ["p0", "p1", "p2", "p4", "p6", "p8", "g-json", "g-digits"]
    return [msgspec.structs.replace(reqs[k], params=msgspec.structs.replace(
        reqs[k].params, max_tokens=80 if k == "p8" else 40)) for k in keep]


def _dm(e: Engine) -> DraftSpeculator:
    assert isinstance(e.spec, DraftSpeculator)
    return e.spec


# ------------------------------------------------------------------ load


def test_the_draft_is_loaded_and_counted(plain: Engine, selfdraft: Engine, model_path: Path) -> None:
    d = selfdraft.info.draft
    assert d is not None and d.path == str(model_path) and d.n_params == plain.info.n_params
    assert selfdraft.info.model_bytes == plain.info.model_bytes + d.model_bytes
    assert d.kv_bytes > 0 and selfdraft.info.kv_bytes >= d.kv_bytes
    # where llama.cpp put it, as it logged it: on the CPU build, the host
    logged = {(b.buffer, b.kind) for b in d.buffers}
    assert any(k == "model" for _, k in logged) and ("CPU", "kv") in logged, d.buffers
    assert plain.info.draft is None and selfdraft.stats().model_bytes == selfdraft.info.model_bytes


def test_a_draft_with_another_vocabulary_is_refused(model_path: Path, tiny_drafts: tuple[Path, Path],
                                                    tmp_path: Path) -> None:
    reranker = write_reranker(tmp_path / "rerank.gguf")
    cases = [(tiny_drafts[1], "token 70001 is"), (reranker, "has 207 tokens and the model 262144"),
             (tmp_path / "missing.gguf", "draft model: no such file")]
    for path, reason in cases:
        with pytest.raises(ModelLoadError, match=reason):
            Engine(settings_for(model_path, speculative="draft", draft_model=str(path), n_parallel=2, ctx_len=1024))


def test_the_draft_follows_the_models_flash_attn(model_path: Path, tiny_drafts: tuple[Path, Path]) -> None:
    """``flash_attn`` is the draft's too, as llama-server's ``-fa`` is: false, both contexts are
    made without flash attention (llama.cpp logs each context's setting as it makes it)."""
    with captured() as lines:
        e = Engine(settings_for(model_path, speculative="draft", draft_model=str(tiny_drafts[0]), n_parallel=1,
                                ctx_len=512, flash_attn=False))
    e.close()
    made = [line.rsplit("=", 1)[1].strip() for line in lines if re.search(r"flash_attn\s+=", line)]
    assert made == ["disabled", "disabled"], made


def test_the_main_plan_leaves_room_for_the_draft(model_path: Path) -> None:
    s = settings_for(model_path, speculative="draft", draft_model=str(model_path), n_gpu_layers="auto",
                     gpu_budget_bytes=[4 << 30], gpu_margin_bytes=0)
    budget = main_settings(s).gpu_budget_bytes
    assert isinstance(budget, list) and (4 << 30) - budget[0] > 200 << 20  # the draft's weights and KV
    free = main_settings(settings_for(model_path, speculative="draft", draft_model=str(model_path), gpu_margin_bytes=0))
    assert (free.gpu_margin_bytes or 0) > 200 << 20
    off = settings_for(model_path, speculative="ngram", gpu_budget_bytes=[4 << 30])
    assert main_settings(off) is off


# ------------------------------------------------------------------ greedy


def test_self_draft_greedy_text_is_the_models_own(plain: Engine, selfdraft: Engine, noise: float) -> None:
    _, finals_a, deltas_a = run_engine(plain, _requests())
    s0 = selfdraft.stats()
    dm = _dm(selfdraft).dm
    decodes0, positions0 = dm.decodes, dm.positions
    _, finals_b, deltas_b = run_engine(selfdraft, _requests())
    s1 = selfdraft.stats()
    assert all(isinstance(f, wire.Finished) for f in [*finals_a.values(), *finals_b.values()])
    drafted, accepted = s1.spec_drafted - s0.spec_drafted, s1.spec_accepted - s0.spec_accepted
    generated, steps = s1.tokens_generated - s0.tokens_generated, s1.gen_steps - s0.gen_steps
    assert drafted > generated // 4, (drafted, generated)
    assert accepted >= 0.9 * drafted, (accepted, drafted)  # the model agrees with itself
    assert generated / steps > 1.3, (generated, steps)
    assert dm.positions - positions0 > dm.decodes - decodes0  # some draft decodes served several slots
    assert selfdraft.spec.window_broken == 0 and _dm(selfdraft).dm.window_resets == 0
    parted = check_parting(deltas_a, deltas_b, noise)
    assert len(parted) <= len(deltas_a) // 2, parted


def test_a_failing_draft_still_gives_the_models_text(plain: Engine, model_path: Path,
                                                       tiny_drafts: tuple[Path, Path], noise: float) -> None:
    reqs = _requests
    e = Engine(settings_for(model_path, speculative="draft", draft_model=str(tiny_drafts[0]), draft_p_min=0.0,
                            n_parallel=4, ctx_len=4096, draft_max=6))
    try:
        _, _, deltas_a = run_engine(plain, reqs()[:4] + reqs()[-2:])
        _, finals, deltas_b = run_engine(e, reqs()[:4] + reqs()[-2:])
        st = e.stats()
        assert all(isinstance(f, wire.Finished) for f in finals.values())
        assert st.spec_drafted > 0 and st.spec_accepted < st.spec_drafted // 2, (st.spec_drafted, st.spec_accepted)
        assert st.spec_drafted < st.tokens_generated  # failing slots pause
        assert e.spec.window_broken == 0
        check_parting(deltas_a, deltas_b, noise)
    finally:
        e.close()


def test_one_draft_decode_per_position_serves_every_drafting_slot(selfdraft: Engine) -> None:
    dm = _dm(selfdraft).dm
    slots = []
    for k in range(4):
        toks = selfdraft.tok.tokenize(PROMPTS[k], add_special=True)
        slots.append(Slot(k, cached=toks[:-1], pending=toks[-1]))
    d0, p0 = dm.decodes, dm.positions
    drafts = dm.propose(slots, [3, 3, 3, 3], 0.0)
    assert [len(d) for d in drafts] == [3, 3, 3, 3]
    assert (dm.decodes - d0, dm.positions - p0) == (3, 12)  # 3 positions, 4 slots each
    assert all(dm.cached[k] == [*s.cached, s.pending, *drafts[k][:2]] for k, s in enumerate(slots))
    slots[1].cached = slots[1].cached[:5]  # a slot's history changed: its draft sequence follows
    slots[2].cached = [*slots[2].cached, slots[2].pending, drafts[2][0]]  # one accepted
    slots[2].pending = drafts[2][1]
    d1 = dm.propose(slots, [0, 2, 2, 0], 1.1)  # p_min above 1: no draft, but synced and decoded
    assert d1 == [[], [], [], []] and dm.decodes - d0 == 4
    assert dm.cached[1] == [*slots[1].cached, slots[1].pending] and dm.cached[2][-1] == slots[2].pending


def test_a_request_can_turn_the_draft_off(selfdraft: Engine) -> None:
    before, decodes = selfdraft.stats().spec_drafted, _dm(selfdraft).dm.decodes
    req = wire.GenerateRequest(id="no-draft", prompt=PROMPTS[0], speculative=False,
                               params=wire.SamplingParams(temperature=0.0, max_tokens=32))
    texts, finals, _ = run_engine(selfdraft, [req])
    assert finals["no-draft"].usage.completion_tokens == 32  # type: ignore[attr-defined]
    assert selfdraft.stats().spec_drafted == before and _dm(selfdraft).dm.decodes == decodes
    req = wire.GenerateRequest(id="draft", prompt=PROMPTS[0], params=wire.SamplingParams(temperature=0.0, max_tokens=32))
    texts2, _, _ = run_engine(selfdraft, [req])
    assert selfdraft.stats().spec_drafted > before
    assert texts2["draft"] == texts["no-draft"]


# ------------------------------------------------------------------ sampled


def test_sampled_tokens_follow_the_target_distribution(plain: Engine, selfdraft: Engine) -> None:
    check_sampled_follows_target(plain, selfdraft, 70_000)
