"""LoRA adapters (worker/lora/adapters.py) with the real engine, model and two generated adapters
(testkit/gguf_lora.py: rank 4 on attn_q/attn_v, random weights)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from corral.model import settings as cs
from corral import wire
from corral.worker.engine import Engine
from corral.worker.model import ModelLoadError
from testkit.gguf_lora import write_bad_lora, write_lora
from worker.conftest import REUSED_TAIL, run_engine, settings_for
from worker.speculation import test_speculation

noise = test_speculation.noise  # the fixture: the batch-shape noise

PROMPT = "The capital of France is"
OTHER = "Once upon a time, in a small village by the sea,"


@pytest.fixture(scope="module")
def adapters(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("lora")
    return write_lora(model_path, d / "a.gguf", seed=7), write_lora(model_path, d / "b.gguf", seed=8)


def _engine(model_path: Path, adapters: tuple[Path, Path], *, scale_a: float = 0.0, **kw: object) -> Engine:
    a, b = adapters
    lora = [cs.LoraAdapter(id="a", path=str(a), scale=scale_a), cs.LoraAdapter(id="b", path=str(b), scale=0.0)]
    return Engine(settings_for(model_path, n_parallel=4, ctx_len=2048, lora=lora, **kw))


@pytest.fixture(scope="module")
def engine(model_path: Path, adapters: tuple[Path, Path]) -> Iterator[Engine]:
    e = _engine(model_path, adapters)
    yield e
    e.close()


@pytest.fixture(scope="module")
def plain(model_path: Path) -> Iterator[Engine]:
    e = Engine(settings_for(model_path, n_parallel=4, ctx_len=2048))
    yield e
    e.close()


def _req(rid: str, lora: list[wire.LoraScale] | None, prompt: str = PROMPT, n: int = 16) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, lora=lora,
                                params=wire.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))


def _cold(e: Engine) -> None:
    """No slot holds a cached prefix (every test's runs start alike: one prefill of the whole prompt)."""
    for s in e.slots:
        e._clear_slot(s)


def _alone(e: Engine, rid: str, lora: list[wire.LoraScale] | None, prompt: str = PROMPT) -> str:
    _cold(e)
    texts, finals, _ = run_engine(e, [_req(rid, lora, prompt)])
    assert isinstance(finals[rid], wire.Finished), finals[rid]
    return texts[rid]


def _deltas(e: Engine, rid: str, lora: list[wire.LoraScale] | None, prompt: str) -> list[wire.TokenLogprob]:
    """Each greedy token with its two best alternatives (a cold run, as ``_alone``)."""
    _cold(e)
    req = msgspec.structs.replace(_req(rid, lora, prompt), logprobs=2)
    _, finals, deltas = run_engine(e, [req])
    assert isinstance(finals[rid], wire.Finished), finals[rid]
    return [lp for d in deltas[rid] for lp in d.logprobs]


A1 = [wire.LoraScale("a", 1.0)]
B1 = [wire.LoraScale(1, 1.0)]


def test_info_lists_adapters_and_counts_their_bytes(engine: Engine, plain: Engine, adapters: tuple[Path, Path]) -> None:
    info = engine.info
    assert [(x.id, x.name, x.path) for x in info.lora] == [(0, "a", str(adapters[0])), (1, "b", str(adapters[1]))]
    assert all(x.bytes > 100_000 for x in info.lora)
    assert all([b.kind for b in x.buffers] == ["lora"] and x.buffers[0].bytes > 100_000 for x in info.lora), info.lora
    assert info.model_bytes == plain.info.model_bytes + sum(x.bytes for x in info.lora)
    assert engine.stats().model_bytes == info.model_bytes


def test_scale_0_is_the_base_model_and_scale_1_differs(engine: Engine, plain: Engine) -> None:
    base = _alone(plain, "plain", None)
    assert _alone(engine, "none", None) == base  # both configured at scale 0
    assert _alone(engine, "a0", [wire.LoraScale("a", 0.0), wire.LoraScale(1, 0.0)]) == base
    a1 = _alone(engine, "a1", A1)
    b1 = _alone(engine, "b1", B1)
    assert a1 != base and b1 != base and a1 != b1


def test_default_scale_from_the_config(model_path: Path, adapters: tuple[Path, Path], engine: Engine) -> None:
    e = _engine(model_path, adapters, scale_a=1.0)
    try:
        assert _alone(e, "d", None) == _alone(engine, "a1", A1)
        assert _alone(e, "off", [wire.LoraScale("b", 0.0)]) == _alone(engine, "none", None)  # listed: others at 0
    finally:
        e.close()


def test_concurrent_adapter_sets_each_get_their_own_tokens(engine: Engine) -> None:
    alone = {"x": _alone(engine, "x", None), "y": _alone(engine, "y", A1), "z": _alone(engine, "z", B1),
             "w": _alone(engine, "w", A1, OTHER)}
    _cold(engine)
    switches = engine.lora.switches
    texts, finals, _ = run_engine(engine, [_req("x", None), _req("y", A1), _req("z", B1), _req("w", A1, OTHER)])
    assert texts == alone
    assert engine.lora.switches - switches > 3  # the sets took turns


def test_no_adapter_request_beside_an_adapter_one_gets_the_base_tokens(engine: Engine, plain: Engine) -> None:
    base = _alone(plain, "p", None, OTHER)
    _cold(engine)
    texts, _, _ = run_engine(engine, [_req("base", None, OTHER, n=24), _req("ad", A1, OTHER, n=24)])
    assert texts["base"][:len(base)] == base


def test_the_sets_alternate_step_by_step(engine: Engine) -> None:
    """With two sets busy, each step decodes one set, and they take turns."""
    _cold(engine)
    for r in (_req("s1", None, n=8), _req("s2", A1, n=8)):
        engine.submit(r)
    seen = []
    while engine.has_work:
        engine.step()
        seen.append(engine.lora.last_turn)
    engine.take_output()
    busy_both = seen[:14]
    assert all(busy_both[i] != busy_both[i + 1] for i in range(len(busy_both) - 1)), seen


def test_a_prefix_of_one_adapter_set_is_not_reused_by_another(engine: Engine) -> None:
    _cold(engine)
    done = {}
    for rid, lora in (("first", A1), ("other", B1), ("same", A1), ("base", None)):
        # same prompt: another adapter set, the first one's again (its prefix is there), none
        _, finals, _ = run_engine(engine, [_req(rid, lora)])
        done[rid] = finals[rid]
        assert isinstance(done[rid], wire.Finished)
    reused = done["same"].usage.prompt_tokens - REUSED_TAIL
    assert [done[r].usage.cached_tokens for r in ("first", "other", "same", "base")] == [0, 0, reused, 0]
    assert done["same"].slot == done["first"].slot


def test_unknown_adapter_ids_are_rejected(engine: Engine) -> None:
    for bad in ([wire.LoraScale(2, 1.0)], [wire.LoraScale("nope", 1.0)]):
        _, finals, _ = run_engine(engine, [_req("bad", bad)])
        f = finals["bad"]
        assert isinstance(f, wire.RequestFailed) and f.code == "invalid_request", f
        assert "unknown adapter id" in f.message
    assert _alone(engine, "after", None)  # the engine goes on


def test_no_adapters_rejects_any_lora(plain: Engine) -> None:
    _, finals, _ = run_engine(plain, [_req("bad", [wire.LoraScale(0, 1.0)])])
    assert isinstance(finals["bad"], wire.RequestFailed) and finals["bad"].code == "invalid_request"


@pytest.mark.parametrize("kind", ["wrong shape", "not a gguf", "missing"])
def test_a_bad_adapter_file_is_a_load_error(model_path: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / "bad.gguf"
    if kind == "wrong shape":
        write_bad_lora(model_path, path)
    elif kind == "not a gguf":
        path.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="LoRA adapter 'bad'"):
        Engine(settings_for(model_path, n_parallel=1, ctx_len=512, lora=[cs.LoraAdapter(id="bad", path=str(path))]))


def test_speculation_with_an_adapter_verifies_against_the_adapted_model(
        model_path: Path, adapters: tuple[Path, Path], engine: Engine, noise: float) -> None:
    """n-gram drafts verified under the adapter: greedy tokens are the adapter's own without
    speculation (a repetitive prompt, so drafts are made and accepted), except where the two
    part at a near tie inside the batch-shape noise (test_speculation.py: a verifying batch
    rounds differently), and never the base model's."""
    prompt = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"
    _cold(engine)
    want = _deltas(engine, "ref", A1, prompt)
    base = _deltas(engine, "base", None, prompt)
    e = _engine(model_path, adapters, speculative="ngram")
    try:
        _cold(e)
        got = _deltas(e, "spec", A1, prompt)
        assert e.spec.drafted > 0 and e.spec.accepted > 0
    finally:
        e.close()
    ids = [[lp.id for lp in d] for d in (want, got, base)]
    assert ids[0] != ids[2]  # the adapter changes this answer
    parted = next((i for i, (x, y) in enumerate(zip(ids[0], ids[1])) if x != y), None)
    if parted is not None:
        top = want[parted].top
        margin = top[0].logprob - top[1].logprob
        assert margin <= 2 * noise, (parted, margin, noise)
        assert ids[1][:parted + 1] != ids[2][:parted + 1]  # it parted from the adapter's text, not to the base's
