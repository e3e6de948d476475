"""LoRA adapters with the other features that move or keep a slot's cells: a paused request
resumes under its own adapter set (its KV restored, or recomputed under that set while the
other slots decode without adapters), and images under an adapter set are refused. The prompt
cache under adapter sets: tests/worker/lora/test_lora_prompt_cache.py."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from corral.model import settings as cs
from corral import wire
from corral.worker.engine import Engine
from corral.worker.failures import RequestRejected
from testkit.gguf_lora import write_lora
from worker.conftest import run_engine, settings_for
from worker.preempt.test_preempt_engine import OTHER, Run

PROMPT = "The capital of France is"
A1 = [wire.LoraScale("a", 1.0)]
LONG = wire.SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def adapter(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora(model_path, tmp_path_factory.mktemp("lora") / "a.gguf", seed=9)  # an answer of its own all along


def _engine(model_path: Path, adapter: Path, **kw: object) -> Engine:
    lora = [cs.LoraAdapter(id="a", path=str(adapter), scale=0.0)]
    return Engine(settings_for(model_path, n_parallel=4, ctx_len=2048, lora=lora, **kw))


def _cold(e: Engine) -> None:
    for s in e.slots:
        e._clear_slot(s)


def _alone(e: Engine, req: wire.GenerateRequest) -> str:
    _cold(e)
    texts, finals, _ = run_engine(e, [req])
    assert isinstance(finals[req.id], wire.Finished)
    return texts[req.id]


@pytest.mark.parametrize("ram", [0, 1 << 30], ids=["recomputed", "restored"])
def test_a_paused_adapter_request_resumes_under_its_set(model_path: Path, adapter: Path, ram: int) -> None:
    e = _engine(model_path, adapter, prompt_cache_ram=ram)
    try:
        req = wire.GenerateRequest(id="p", prompt=PROMPT, lora=A1, params=LONG)
        want = _alone(e, req)
        base = _alone(e, wire.GenerateRequest(id="b", prompt=PROMPT, params=LONG))
        assert want != base  # the adapter changes the answer: the test can tell the sets apart
        _cold(e)
        run = Run(e)
        e.submit(wire.GenerateRequest(id="p1", prompt=PROMPT, lora=A1, params=LONG))
        run.until(lambda: run.tokens.get("p1", 0) >= 4)
        paused = e.preempt.pause("p1")
        assert paused.paused and paused.kept_kv == (ram > 0)
        for k, p in enumerate(OTHER):  # base requests take every slot: the paused cells are overwritten
            e.submit(wire.GenerateRequest(id=f"o{k}", prompt=p, params=wire.SamplingParams(max_tokens=6, temperature=0.0)))
        run.until(lambda: all(s.busy for s in e.slots))
        e.preempt.resume("p1")
        run.to_end()
        assert run.texts["p1"] == want
        assert all(isinstance(run.finals[f"o{k}"], wire.Finished) for k in range(len(OTHER)))
        assert e.preempt.recomputed == (1 if ram == 0 else 0)
    finally:
        e.close()


def test_images_under_an_adapter_set_are_refused(model_path: Path, adapter: Path, mmproj_path: Path) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buf, "PNG")
    e = _engine(model_path, adapter, mmproj=str(mmproj_path))
    try:
        msg = wire.ChatMessage(role="user", content=f"{wire.MEDIA_MARKER} what is this?", images=[buf.getvalue()])
        with pytest.raises(RequestRejected, match="LoRA"):
            e.prepare(wire.GenerateRequest(id="i", messages=[msg], lora=A1))
        ok = e.prepare(wire.GenerateRequest(id="j", messages=[msg], lora=[wire.LoraScale("a", 0.0)]))
        assert ok.tokens
    finally:
        e.close()
