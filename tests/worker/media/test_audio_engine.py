"""Audio in the engine: the embedded Gemma 3 with a real (random-weight) Qwen2-Audio projector
(testkit/gguf_audio.py), real libmtmd; recordings as the router sends them (16 kHz mono WAV,
api/core/audio.py ``wav_bytes``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import wire
from corral.api.core.audio import WINDOW_SAMPLES, Pcm, wav_bytes
from corral.worker.engine import Engine
from corral.worker.media.audio import AudioChunk
from corral.worker.media.prompt import MediaPrompt
from testkit.audio_files import recording
from testkit.gguf_audio import WINDOW_TOKENS, audio_tokens

from worker.conftest import run_engine, settings_for

pytestmark = pytest.mark.integration

M = wire.MEDIA_MARKER
GREEDY = wire.SamplingParams(max_tokens=3, temperature=0.0)


def clip(seconds: float) -> bytes:
    return wav_bytes(Pcm(recording(seconds)))


def chat(rid: str, *turns: wire.ChatMessage) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, messages=list(turns), params=GREEDY)


def user(text: str, *files: bytes) -> wire.ChatMessage:
    return wire.ChatMessage(role="user", content=text, images=list(files) or None)


@pytest.fixture(scope="module")
def aengine(model_path: Path, audio_mmproj_path: Path) -> Iterator[Engine]:
    e = Engine(settings_for(model_path, n_parallel=2, ctx_len=8192, mmproj=str(audio_mmproj_path)))
    yield e
    e.close()


def test_one_window_holds_window_samples(aengine: Engine) -> None:
    """libmtmd's mel makes a window of 30 s less 161 samples: one sample more is a second
    window (750 more positions); the router cuts transcriptions at WINDOW_SAMPLES for it."""
    samples = recording(31)
    for n, windows in ((WINDOW_SAMPLES, 1), (WINDOW_SAMPLES + 1, 2)):
        toks = aengine.prepare(chat(f"w{n}", user(f"Hear {M} now.", wav_bytes(Pcm(samples[:n]))))).tokens
        assert isinstance(toks, MediaPrompt)
        assert [c.n_tokens for c in toks.chunks] == [WINDOW_TOKENS] * windows, n


def test_model_info_says_audio(aengine: Engine) -> None:
    assert aengine.info.audio is True and aengine.info.vision is False


@pytest.mark.parametrize("seconds", [1, 29, 30, 31, 61])
def test_every_started_window_is_750_positions(aengine: Engine, seconds: float) -> None:
    toks = aengine.prepare(chat("n", user(f"Hear {M} now.", clip(seconds)))).tokens
    assert isinstance(toks, MediaPrompt)
    assert all(isinstance(c, AudioChunk) for c in toks.chunks)
    assert [c.n_tokens for c in toks.chunks] == [WINDOW_TOKENS] * (audio_tokens(seconds) // WINDOW_TOKENS)
    ids = [tuple(toks[c.start: c.end]) for c in toks.chunks]
    assert len(set(ids)) == len(ids)  # each window has ids of its own, even of one recording
    assert aengine.prepare(chat("n2", user(f"Hear {M} now.", clip(seconds)))).tokens == toks  # the same ids again


def test_a_recording_answers_and_its_next_turn_is_a_prefix_hit(aengine: Engine) -> None:
    first = user(f"What is said in {M}?", clip(31))
    before = aengine.media.encodes
    texts, finals, _ = run_engine(aengine, [chat("t1", first)])
    fin = finals["t1"]
    assert isinstance(fin, wire.Finished) and fin.usage.prompt_tokens >= 2 * WINDOW_TOKENS
    assert aengine.media.encodes == before + 2  # one encode a window
    turn2 = (first, wire.ChatMessage(role="assistant", content=texts.get("t1", "") or "words"), user("Again?"))
    _, finals, _ = run_engine(aengine, [chat("t2", *turn2)])
    fin2 = finals["t2"]
    assert isinstance(fin2, wire.Finished) and fin2.usage.cached_tokens >= 2 * WINDOW_TOKENS
    assert aengine.media.encodes == before + 2  # from the cache: not encoded again


def test_an_image_to_an_audio_only_projector_is_refused(aengine: Engine) -> None:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, "PNG")
    _, finals, _ = run_engine(aengine, [chat("img", user(f"See {M}", buf.getvalue()))])
    fin = finals["img"]
    assert isinstance(fin, wire.RequestFailed) and fin.code == "invalid_request", fin


def _beside_count(engine: Engine, group_a: str | None, group_b: str | None) -> int:
    """Side-context decodes while request a generates and b's recording waits for media."""
    long = wire.SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)  # aborted once b ends
    a = wire.GenerateRequest(id=f"a{group_a}", messages=[user(f"One {M} two", clip(1))], params=long,
                             media_group=group_a)
    b = wire.GenerateRequest(id=f"b{group_b}", messages=[user(f"Three {M} four", clip(2))], params=GREEDY,
                             media_group=group_b)
    engine.submit(a)
    for _ in range(500):  # until a generates
        engine.step()
        if any(s.job is not None and s.job.req.id == a.id and s.n_gen > 0 for s in engine.slots):
            break
    before = engine.media.side_images
    engine.submit(b)
    done = False
    for _ in range(2000):  # until b ends (a still generating)
        msgs = engine.step()
        if any(isinstance(m, wire.Finished | wire.RequestFailed) and m.id == b.id for m in msgs):
            done = isinstance(next(m for m in msgs if getattr(m, "id", None) == b.id and not
                                   isinstance(m, wire.Delta)), wire.Finished)
            break
    assert done
    assert any(s.job is not None and s.job.req.id == a.id for s in engine.slots)  # b ran beside a's stream
    engine.abort(a.id)
    run_engine(engine, [])
    return engine.media.side_images - before


def test_windows_of_one_recording_do_not_yield_to_one_another(aengine: Engine) -> None:
    assert _beside_count(aengine, None, None) == 1  # another request's stream: b's audio goes beside it
    assert _beside_count(aengine, "t1", "t1") == 0  # a sibling window: decoded on the engine's thread
