"""Images in the engine: the embedded Gemma 3 with a real (random-weight) Gemma 3 projector
(testkit/gguf_vision.py), real libmtmd, images made with Pillow."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from corral import wire
from corral.worker.engine import Engine
from corral.worker.cache.kv_store import common_prefix
from corral.worker.speculation.speculator import find_draft
from corral.worker.media.projector import media_ids
from corral.worker.media.prompt import MediaPrompt
from testkit.gguf_vision import image_tokens

from worker.conftest import run_engine, settings_for

pytestmark = pytest.mark.integration

M = wire.MEDIA_MARKER
N_IMG = image_tokens()  # positions one image takes with the fixture's projector (16)
GREEDY = wire.SamplingParams(max_tokens=6, temperature=0.0)


def picture(seed: int, fmt: str = "PNG", size: tuple[int, int] = (100, 80)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def chat(rid: str, *turns: wire.ChatMessage, params: wire.SamplingParams = GREEDY) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, messages=list(turns), params=params)


def user(text: str, *images: bytes) -> wire.ChatMessage:
    return wire.ChatMessage(role="user", content=text, images=list(images) or None)


@pytest.fixture(scope="module")
def vengine(model_path: Path, mmproj_path: Path) -> Iterator[Engine]:
    # n_batch 8: an image (16 positions) is decoded in two pieces, a prompt in chunks of 8
    e = Engine(settings_for(model_path, n_parallel=2, ctx_len=2048, n_batch=8, mmproj=str(mmproj_path)))
    yield e
    e.close()


def finished(finals: dict[str, object], rid: str) -> wire.Finished:
    fin = finals[rid]
    assert isinstance(fin, wire.Finished), fin
    return fin


def test_model_info_says_vision(vengine: Engine, mmproj_path: Path) -> None:
    assert vengine.info.vision is True
    assert vengine.info.mmproj_bytes == mmproj_path.stat().st_size
    # where libmtmd runs it, as it logged it (the CPU build: the host; tests/gpu: Vulkan0)
    assert vengine.info.mmproj_device == "CPU", vengine.info
    assert {b.buffer for b in vengine.info.mmproj_buffers} <= {"CPU"}


def test_the_projector_follows_the_models_flash_attn(vengine: Engine, model_path: Path, mmproj_path: Path) -> None:
    """``flash_attn`` is the model's and its projector's, as llama-server's ``-fa`` is: unset,
    llama.cpp decides (the CPU backend has it); false, libmtmd's attention is not flash."""
    assert vengine.media.proj is not None and vengine.media.proj.flash_attn is True
    off = Engine(settings_for(model_path, n_parallel=1, ctx_len=512, flash_attn=False, mmproj=str(mmproj_path)))
    try:
        assert off.media.proj is not None and off.media.proj.flash_attn is False
        texts, finals, _ = run_engine(off, [chat("off", user(f"Describe {M} please.", picture(1)))])
        assert finished(finals, "off").usage.completion_tokens > 0
    finally:
        off.close()


def test_an_image_request_answers(vengine: Engine) -> None:
    before = vengine.media.encodes
    texts, finals, _ = run_engine(vengine, [chat("one", user(f"Describe {M} please.", picture(1)))])
    fin = finished(finals, "one")
    assert fin.usage.completion_tokens > 0
    text_only = vengine.prepare(chat("t", user("Describe  please.")))
    # the image's positions plus <start_of_image> ... <end_of_image> and the spaces around them
    assert fin.usage.prompt_tokens >= len(text_only.tokens) + N_IMG
    assert vengine.media.encodes == before + 1
    assert texts.get("one", "") != "" or fin.finish_reason == "stop"


def test_prompt_positions_of_images(vengine: Engine) -> None:
    p = vengine.prepare(chat("pos", user(f"a {M} b {M} c", picture(2), picture(3))))
    toks = p.tokens
    assert isinstance(toks, MediaPrompt) and len(toks.chunks) == 2
    for span in toks.chunks:
        ids = toks[span.start: span.end]
        assert len(ids) == N_IMG and all(t < 0 for t in ids)
    assert all(t >= 0 for i, t in enumerate(toks) if toks.chunk_at(i) is None)
    # the same pixels in another file format: the same ids; other pixels: other ids
    a, b = toks.chunks
    again = vengine.prepare(chat("pos2", user(f"x {M}", picture(2, "BMP")))).tokens
    assert isinstance(again, MediaPrompt)
    s = again.chunks[0]
    assert again[s.start: s.end] == toks[a.start: a.end]
    assert toks[a.start: a.end] != toks[b.start: b.end]


def test_two_images_in_one_message_and_across_turns(vengine: Engine) -> None:
    before = vengine.media.encodes
    _, finals, _ = run_engine(vengine, [chat("two", user(f"Compare {M} with {M}.", picture(4), picture(5, "JPEG")))])
    assert finished(finals, "two").usage.prompt_tokens > 2 * N_IMG
    assert vengine.media.encodes == before + 2
    turns = (user(f"First {M}", picture(6)), wire.ChatMessage(role="assistant", content="A picture."),
             user(f"And this one {M}?", picture(7)))
    _, finals, _ = run_engine(vengine, [chat("turns", *turns)])
    assert finished(finals, "turns").usage.prompt_tokens > 2 * N_IMG


def test_same_image_next_turn_is_a_prefix_hit(vengine: Engine) -> None:
    img = picture(11)
    first = user(f"What is in {M}?", img)
    texts, finals, _ = run_engine(vengine, [chat("turn1", first)])
    answer = texts.get("turn1", "") or "something"
    p1 = vengine.prepare(chat("p1", first)).tokens
    assert isinstance(p1, MediaPrompt)
    encodes = vengine.media.encodes
    turn2 = (first, wire.ChatMessage(role="assistant", content=answer), user("Say it again."))
    _, finals, _ = run_engine(vengine, [chat("turn2", *turn2)])
    fin = finished(finals, "turn2")
    assert fin.usage.cached_tokens >= p1.chunks[0].end  # the image's positions came from the cache
    assert vengine.media.encodes == encodes  # and it was not encoded again
    # another picture at the same place: a miss from its first position on, and an encode
    other = (user(f"What is in {M}?", picture(12)), wire.ChatMessage(role="assistant", content=answer),
             user("Say it again."))
    _, finals, _ = run_engine(vengine, [chat("turn2b", *other)])
    fin = finished(finals, "turn2b")
    assert fin.usage.cached_tokens <= p1.chunks[0].start
    assert vengine.media.encodes == encodes + 1


def test_greedy_is_deterministic(vengine: Engine) -> None:
    req = [user(f"Look: {M}", picture(21))]
    a, _, _ = run_engine(vengine, [chat("d1", *req)])
    for slot in vengine.slots:  # a cold start, not the cache of the first run
        vengine._clear_slot(slot)
    b, _, _ = run_engine(vengine, [chat("d2", *req)])
    c, _, _ = run_engine(vengine, [chat("d3", *req)])  # from the cache
    assert a["d1"] == b["d2"] == c["d3"]


def test_an_image_prefill_does_not_stall_another_stream(vengine: Engine) -> None:
    long = wire.SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    vengine.submit(wire.GenerateRequest(id="stream", prompt="Once upon a time", params=long))
    for _ in range(50):  # until the stream generates
        vengine.step()
        if any(s.job is not None and s.job.req.id == "stream" and s.n_gen > 0 for s in vengine.slots):
            break
    stream = next(s for s in vengine.slots if s.job is not None and s.job.req.id == "stream")
    pieces, side = vengine.media.pieces, vengine.media.side_images
    vengine.submit(chat("img", user(f"What is {M}?", picture(31, size=(300, 200)))))
    gen_per_step: list[int] = []
    first_delta = False
    steps = 0
    while not first_delta:
        steps += 1
        assert steps < 200
        n = stream.n_gen
        msgs = vengine.step()
        gen_per_step.append(stream.n_gen - n)
        first_delta = any(isinstance(m, wire.Delta | wire.Finished) and m.id == "img" for m in msgs)
    # beside a stream the image is decoded in the side context (vision_side.py), not in the steps
    assert vengine.media.pieces == pieces and vengine.media.side_images - side == 1
    assert steps >= 3  # the text before it, the image copied in, the text after it
    assert all(g == 1 for g in gen_per_step), gen_per_step  # the stream drew a token every step
    vengine.abort("stream")
    vengine.abort("img")
    run_engine(vengine, [])


# ---------------------------------------------------------------------- bad input


def failed(engine: Engine, req: wire.GenerateRequest) -> wire.RequestFailed:
    _, finals, _ = run_engine(engine, [req])
    fin = finals[req.id]
    assert isinstance(fin, wire.RequestFailed), fin
    return fin


@pytest.mark.parametrize("data", [b"not an image at all", picture(41)[:60], b"GIF89a" + b"\0" * 20])
def test_an_undecodable_image_is_refused(vengine: Engine, data: bytes) -> None:
    stream = wire.GenerateRequest(id="ok", prompt="The sky is", params=wire.SamplingParams(max_tokens=8, temperature=0))
    vengine.submit(stream)
    fin = failed(vengine, chat("bad", user(f"What is {M}?", data)))
    assert fin.code == "invalid_request" and "image 1 could not be decoded" in fin.message
    assert not any(s.busy for s in vengine.slots)
    _, finals, _ = run_engine(vengine, [])
    assert vengine.stats().slots_busy == 0


def test_markers_and_images_must_pair_up(vengine: Engine) -> None:
    fin = failed(vengine, chat("pair", user(f"One marker {M}", picture(1), picture(2))))
    assert fin.code == "invalid_request" and "1 media marker(s) but 2 file(s)" in fin.message


def test_other_requests_run_on_beside_a_bad_image(vengine: Engine) -> None:
    good = wire.GenerateRequest(id="good", prompt="The sky is", params=wire.SamplingParams(max_tokens=8, temperature=0))
    vengine.submit(good)
    vengine.step()
    texts, finals, _ = run_engine(vengine, [chat("bad2", user(f"{M}", b"\x89PNG\r\n\x1a\n broken"))])
    assert isinstance(finals["bad2"], wire.RequestFailed)
    assert finished(finals, "good").usage.completion_tokens == 8


def test_more_image_positions_than_the_context(model_path: Path, mmproj_path: Path) -> None:
    e = Engine(settings_for(model_path, n_parallel=1, ctx_len=64, mmproj=str(mmproj_path)))
    try:
        imgs = [picture(50 + i) for i in range(4)]
        fin = failed(e, chat("big", user(" ".join([M] * 4), *imgs)))
        assert fin.code == "context_length_exceeded"
        _, finals, _ = run_engine(e, [chat("fits", user(f"{M}", imgs[0]))])
        assert isinstance(finals["fits"], wire.Finished)
    finally:
        e.close()


def test_images_to_a_model_without_a_projector(engine: Engine) -> None:
    fin = failed(engine, chat("noproj", user(f"What is {M}?", picture(1))))
    assert fin.code == "invalid_request" and "gemma-3-270m" in fin.message and "images" in fin.message
    fin = failed(engine, wire.GenerateRequest(id="noproj2", prompt=f"{M} is", images=[picture(1)], params=GREEDY))
    assert fin.code == "invalid_request"
    assert engine.info.vision is False and engine.info.mmproj_bytes == 0


def test_a_raw_prompt_with_an_image(vengine: Engine) -> None:
    req = wire.GenerateRequest(id="raw", prompt=f"Picture: {M} Caption:", images=[picture(61)], params=GREEDY)
    _, finals, _ = run_engine(vengine, [req])
    assert finished(finals, "raw").usage.prompt_tokens > N_IMG
    fin = failed(vengine, wire.GenerateRequest(id="echo", prompt=f"{M} x", images=[picture(61)], params=GREEDY,
                                               echo=True))
    assert fin.code == "invalid_request"


def test_a_bad_projector_is_a_load_error(model_path: Path, tmp_path: Path) -> None:
    from corral.worker.model import ModelLoadError

    with pytest.raises(ModelLoadError, match="mmproj: no such file"):
        Engine(settings_for(model_path, n_parallel=1, ctx_len=256, mmproj=str(tmp_path / "none.gguf")))
    with pytest.raises(ModelLoadError, match="mmproj: libmtmd could not load"):
        Engine(settings_for(model_path, n_parallel=1, ctx_len=256, mmproj=str(model_path)))  # a text model


# ---------------------------------------------------------------------- pseudo-ids (no engine)


def test_pseudo_ids_compare_like_tokens() -> None:
    a, b = media_ids(b"a" * 16, N_IMG), media_ids(b"b" * 16, N_IMG)
    assert all(-(2**31) <= t < 0 for t in a + b) and len(set(a)) == N_IMG
    text = [2, 100, 200]
    assert common_prefix(text + a + [5], text + a + [6]) == len(text) + N_IMG
    assert common_prefix(text + a + [5], text + b + [5]) == len(text)


def test_speculation_never_drafts_a_pseudo_id() -> None:
    ids = media_ids(b"c" * 16, 4)
    hist = np.array([7, 8, 9, *ids, 10, 11, 7, 8, 9], dtype=np.int32)
    assert find_draft(hist, 8, n_max=3, n_min=2) == []  # what followed 7 8 9 was an image
    hist = np.array([7, 8, 9, 12, 13, *ids, 7, 8, 9], dtype=np.int32)
    assert find_draft(hist, 8, n_max=3, n_min=2) == [12, 13]  # cut where the image starts


# ---------------------------------------------------------------------- a real worker process


def test_a_worker_process_takes_images_over_the_wire(model_path: Path, mmproj_path: Path) -> None:
    from worker.client import WorkerClient

    with WorkerClient(settings_for(model_path, n_parallel=1, ctx_len=1024, mmproj=str(mmproj_path))) as c:
        ready = c.wait_ready()
        assert ready.info.vision and ready.info.mmproj_bytes == mmproj_path.stat().st_size
        _, _, fin = c.generate(chat("w1", user(f"What is {M}?", picture(71, "JPEG"))))
        assert isinstance(fin, wire.Finished) and fin.usage.prompt_tokens > N_IMG
        _, _, bad = c.generate(chat("w2", user(f"What is {M}?", b"\xff\xd8\xff broken jpeg")))
        assert isinstance(bad, wire.RequestFailed) and bad.code == "invalid_request"
        _, _, again = c.generate(chat("w3", user(f"What is {M}?", picture(71, "JPEG"))))
        assert isinstance(again, wire.Finished) and again.usage.cached_tokens > N_IMG  # the worker lives on


def test_a_bad_projector_is_load_failed(model_path: Path, tmp_path: Path) -> None:
    from worker.client import WorkerClient

    junk = tmp_path / "mmproj-junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    with WorkerClient(settings_for(model_path, n_parallel=1, ctx_len=256, mmproj=str(junk))) as c:
        assert isinstance(c.recv(30), wire.Loading)
        msg = c.recv(120)
        assert isinstance(msg, wire.LoadFailed) and "mmproj" in msg.reason, msg
        assert c.proc.wait(30) == 1
