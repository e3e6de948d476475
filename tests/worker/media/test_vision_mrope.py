"""M-RoPE images in the engine (Qwen2-VL): a tiny ``qwen2vl`` text model and a ``qwen2vl_merger``
projector written offline (testkit/gguf_qwen2vl.py), real libmtmd, images made with Pillow.

The reference is libmtmd's own path in the same context: ``mtmd_helper_eval_chunks`` (llama.cpp's
positions: t/y/x for an image, text after it advanced by the image's n_pos) on a sequence no slot
uses, then greedy single-token decodes. corral's greedy tokens must be the same; with the
positions of a Gemma-style image (one a token) they are not (``test_wrong_positions_differ``)."""

from __future__ import annotations

import ctypes
import io
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as ll
import llama_cpp.mtmd_cpp as mtmd
import msgspec
import numpy as np
import pytest
from PIL import Image

from corral import wire
from corral.worker.engine import Engine
from corral.worker.sampling.sampler import logits_at
from corral.worker.slots import Slot
from corral.worker.media.prompt import MediaPrompt
from corral.worker.media.prompt import kv_pos
from testkit.gguf_qwen2vl import image_grid, write_qwen2vl_mmproj, write_qwen2vl_model

from worker.conftest import run_engine, settings_for
from worker.media.test_vision_beside import _stream_running

pytestmark = pytest.mark.integration

M = wire.MEDIA_MARKER
W, H = 64, 48  # 8 x 6 image tokens, n_pos 8
N_GEN = 8


def picture(seed: int, size: tuple[int, int] = (W, H)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def qwen_pair(qwen2vl_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    return qwen2vl_pair


def _engine(pair: tuple[Path, Path], **kw: object) -> Engine:
    model, mmproj = pair
    # n_batch 16: a 48-token image goes in 3 pieces; 3 slots, the last one is the reference's sequence
    base: dict[str, object] = dict(model_id="qwen2vl", n_parallel=3, ctx_len=3 * 512, n_batch=16, mmproj=str(mmproj))
    return Engine(settings_for(model, **{**base, **kw}))


@pytest.fixture(scope="module")
def qengine(qwen_pair: tuple[Path, Path]) -> Iterator[Engine]:
    e = _engine(qwen_pair)
    yield e
    e.close()


def raw(rid: str, prompt: str, *images: bytes, **kw: object) -> wire.GenerateRequest:
    return wire.GenerateRequest(id=rid, prompt=prompt, images=list(images),
                                params=wire.SamplingParams(max_tokens=N_GEN, temperature=0.0, ignore_eos=True),
                                logprobs=0, **kw)  # type: ignore[arg-type]


def tokens_of(deltas: dict[str, list[wire.Delta]], rid: str) -> list[int]:
    return [lp.id for d in deltas.get(rid, []) for lp in (d.logprobs or [])]


def reference(e: Engine, prompt: str, images: list[bytes], n: int = N_GEN) -> list[int]:
    """Greedy tokens (end of generation banned) through libmtmd's helper (its positions), on the
    last slot's sequence."""
    seq = e.slots[-1].index
    assert e.media.proj is not None and not any(s.busy for s in e.slots)
    toks = e.media.tokenize(prompt, images, add_special=True)
    assert isinstance(toks, MediaPrompt) and toks.chunks
    e._clear_slot(e.slots[-1])
    n_past = ll.llama_pos(0)
    rc = mtmd.mtmd_helper_eval_chunks(e.media.proj.ctx, e.m.ctx, toks.chunks[0].owner.ptr, 0, seq,
                                      e.media.piece, True, ctypes.byref(n_past))
    assert rc == 0
    b = ll.llama_batch_init(1, 0, 1)
    out: list[int] = []
    try:
        for _ in range(n):
            x = np.array(logits_at(e.m.ctx, -1, e.m.n_vocab), dtype=np.float32)
            x[list(e.tok.eog_tokens)] = -np.inf  # ignore_eos, as the requests
            tok = int(np.argmax(x))
            out.append(tok)
            b.n_tokens = 1
            b.token[0], b.pos[0], b.n_seq_id[0], b.seq_id[0][0], b.logits[0] = tok, n_past.value, 1, seq, 1
            assert ll.llama_decode(e.m.ctx, b) == 0
            n_past.value += 1
    finally:
        ll.llama_batch_free(b)
        e._clear_slot(e.slots[-1])
    return out


def test_an_mrope_projector_loads(qengine: Engine) -> None:
    assert qengine.media.proj is not None and qengine.media.proj.mrope
    assert qengine.info.vision is True


def test_positions_advance_by_n_pos(qengine: Engine) -> None:
    toks = qengine.prepare(raw("pos", f"the picture {M} caption:", picture(1))).tokens
    assert isinstance(toks, MediaPrompt) and len(toks.chunks) == 1
    span = toks.chunks[0]
    nx, ny = image_grid(W, H)
    assert (span.n_tokens, span.n_pos) == (nx * ny, max(nx, ny))
    assert kv_pos(toks, span.start) == span.start
    assert kv_pos(toks, span.end) == span.start + max(nx, ny)
    assert kv_pos(toks, len(toks) + 3) == len(toks) + 3 - (nx * ny - max(nx, ny))


def test_greedy_tokens_match_libmtmd(qengine: Engine) -> None:
    prompt, imgs = f"one {M} and two {M} what:", [picture(2), picture(3, (40, 72))]
    _, finals, deltas = run_engine(qengine, [raw("g", prompt, *imgs)])
    assert isinstance(finals["g"], wire.Finished), finals["g"]
    assert tokens_of(deltas, "g") == reference(qengine, prompt, imgs)


def test_reuse_cuts_the_kv_at_the_position(qengine: Engine) -> None:
    img = picture(4)
    first = f"look {M} the sky is"
    run_engine(qengine, [raw("r1", first, img)])
    # the same image and more text: the image is a prefix hit, the rest decoded after its n_pos
    again = f"look {M} the sea is red"
    _, finals, deltas = run_engine(qengine, [raw("r2", again, img)])
    fin = finals["r2"]
    assert isinstance(fin, wire.Finished) and fin.usage.cached_tokens > 48
    assert tokens_of(deltas, "r2") == reference(qengine, again, [img])


def test_wrong_positions_differ(qengine: Engine) -> None:
    """The check has teeth: text after the image placed one position a token (as for Gemma)
    instead of at the image's n_pos gives other tokens than libmtmd's."""
    prompt, img = f"the picture {M} caption: the", [picture(5)]
    right = reference(qengine, prompt, img)
    qengine.submit(qengine.prepare(raw("w", prompt, *img)))
    toks = qengine.jobs["w"].tokens
    assert isinstance(toks, MediaPrompt)
    toks.chunks[0].n_pos = toks.chunks[0].n_tokens
    _, _, deltas = run_engine(qengine, [])
    assert len(tokens_of(deltas, "w")) == N_GEN and tokens_of(deltas, "w") != right


def test_an_image_request_drafts_and_its_rollback_cuts_by_position(qwen_pair: tuple[Path, Path]) -> None:
    """Drafts after an M-RoPE image: every step a draft of the next three greedy tokens with
    the third one wrong, so two are accepted and a tail of two rejected each time. The tail is
    cut at its KV position (cut at its length, as for a text prompt, the rejected cells stay in
    the KV and the next decode fails); each step the slot's last cell is where its cached
    length says, and the tokens are libmtmd's greedy ones."""
    e = _engine(qwen_pair, speculative="ngram", n_parallel=2)
    n = 40
    long = wire.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    try:
        prompt, img = f"the {M} the sky the", [picture(6)]
        ref = reference(e, prompt, img, n + 4)
        vocab = e.m.n_vocab

        sent: list[list[int]] = []

        def drafts(gen: list[Slot], room: int, m: object) -> list[list[int]]:
            out = []
            for slot in gen:  # the slot's pending token is ref[n_gen - 1]
                k = slot.n_gen
                out.append([ref[k], ref[k + 1], (ref[k + 2] + 1) % vocab][: max(0, slot.max_tokens - k - 1)])
            sent.extend(d for d in out if d)
            return out

        e.spec._drafts = drafts  # type: ignore[method-assign]
        e.submit(e.prepare(msgspec.structs.replace(raw("s", prompt, *img), params=long)))
        deltas: list[wire.Delta] = []
        fin = None
        while fin is None:
            for msg in e.step():
                if isinstance(msg, wire.Delta):
                    deltas.append(msg)
                elif isinstance(msg, (wire.Finished, wire.RequestFailed)):
                    fin = msg
            slot = e.slots[0]
            if slot.job is not None and slot.n_gen > 0:
                assert ll.llama_memory_seq_pos_max(e.m.memory, slot.index) == \
                    kv_pos(slot.job.tokens, len(slot.cached)) - 1
        assert isinstance(fin, wire.Finished), fin
        assert len(sent) > 10 and e.spec.drafted == sum(map(len, sent))
        assert e.spec.accepted == sum(min(2, len(d)) for d in sent)  # the wrong third token never
        assert tokens_of({"s": deltas}, "s") == ref[:n]
    finally:
        e.close()


def _beside_a_stream(e: Engine, rid: str, prompt: str, img: bytes) -> list[int]:
    """The image request's greedy tokens while a text stream generates in another slot."""
    for slot in e.slots:  # no prefix hit: the image is encoded and decoded again
        e._clear_slot(slot)
    _stream_running(e)
    e.submit(e.prepare(raw(rid, prompt, img)))
    deltas: list[wire.Delta] = []
    for _ in range(3000):
        out = e.step()
        deltas += [m for m in out if isinstance(m, wire.Delta) and m.id == rid]
        if any(isinstance(m, (wire.Finished, wire.RequestFailed)) and m.id == rid for m in out):
            break
    assert any(s.job is not None and s.job.req.id == "stream" for s in e.slots)  # still streaming
    e.abort("stream")
    run_engine(e, [])
    return tokens_of({rid: deltas}, rid)


def test_an_image_beside_a_stream_decodes_in_the_side_context_at_its_positions(qengine: Engine) -> None:
    """Beside a generating slot an M-RoPE image is decoded in the side context with its 2-D
    positions (vision_side.py), and the KV copied back gives the tokens the engine's own steps
    give beside the same stream."""
    v = qengine.media
    prompt, img = f"the picture {M} caption: the", picture(8)
    v.side.usable = False  # the reference: the image decoded in the steps beside the same stream
    try:
        pieces = v.pieces
        in_steps = _beside_a_stream(qengine, "mr-a", prompt, img)
        assert v.pieces > pieces
    finally:
        v.side.usable = True
    pieces, side = v.pieces, v.side_images
    beside = _beside_a_stream(qengine, "mr-b", prompt, img)
    assert v.side.usable and v.side_images == side + 1 and v.pieces == pieces  # none of it in the steps
    assert len(beside) == N_GEN and beside == in_steps


LONG_PROMPT = f"look at this picture {M} and say in one line what the picture shows: the sky is red the sea is"


def test_a_prompt_cache_restore_keeps_positions(qengine: Engine) -> None:
    """A host-RAM entry with an image, restored into an empty slot and cut inside its text:
    its cells keep their positions, the rest is decoded after them."""
    img = picture(7)
    for s in qengine.slots:  # (the module's engine: an earlier test's slot may hold more than 64 tokens too)
        qengine._clear_slot(s)
    _, _, _ = run_engine(qengine, [raw("c1", LONG_PROMPT, img)])
    slot = next(s for s in qengine.slots if len(s.cached) > 64)  # c1's
    assert qengine.prompt_cache.save(slot, 0)
    for s in qengine.slots:
        qengine._clear_slot(s)
    hits = qengine.prompt_cache.hits
    other = LONG_PROMPT.replace("the sea is", "the tree is green the road")
    _, finals, deltas = run_engine(qengine, [raw("c2", other, img)])
    fin = finals["c2"]
    assert isinstance(fin, wire.Finished) and qengine.prompt_cache.hits == hits + 1 and fin.usage.cached_tokens > 48
    assert tokens_of(deltas, "c2") == reference(qengine, other, [img])


def test_a_paused_image_request_resumes_with_its_positions(qengine: Engine) -> None:
    img = picture(8)
    n = 16
    req = msgspec.structs.replace(raw("p", LONG_PROMPT, img),
                                  params=wire.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
    qengine.submit(req)
    got: list[int] = []
    for _ in range(500):
        for m in qengine.step():
            if isinstance(m, wire.Delta):
                got += [lp.id for lp in m.logprobs or []]
        if len(got) >= 4:
            break
    assert qengine.preempt.pause("p").paused
    for s in qengine.slots:  # its cells are gone from the context: resume restores them from the store
        qengine._clear_slot(s)
    qengine.preempt.resume("p")
    _, finals, deltas = run_engine(qengine, [])
    assert isinstance(finals["p"], wire.Finished), finals["p"]
    assert got + tokens_of(deltas, "p") == reference(qengine, LONG_PROMPT, [img], n)


def test_qwen25vl_windowed_projector_matches_libmtmd(qwen_pair: tuple[Path, Path],
                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """Qwen2.5-VL's projector (windowed attention in the tower): the same positions, the same tokens."""
    mmproj = write_qwen2vl_mmproj(tmp_path_factory.mktemp("qwen25vl") / "mmproj.gguf", version="2.5")
    e = _engine((qwen_pair[0], mmproj), n_parallel=2)
    try:
        assert e.media.proj is not None and e.media.proj.mrope
        prompt, imgs = f"see {M} it is", [picture(9, (96, 64))]
        _, _, deltas = run_engine(e, [raw("q25", prompt, *imgs)])
        assert tokens_of(deltas, "q25") == reference(e, prompt, imgs)
    finally:
        e.close()


def test_qwen3vl_deepstack_embeddings_match_libmtmd(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Qwen3-VL: an image embedding is the text width times (1 + deepstack layers), all of it decoded."""
    d = tmp_path_factory.mktemp("qwen3vl")
    model = write_qwen2vl_model(d / "qwen3vl.gguf", arch="qwen3vl")
    e = _engine((model, write_qwen2vl_mmproj(d / "mmproj.gguf", version="3")), n_parallel=2)
    try:
        assert e.media.proj is not None and e.media.proj.mrope
        assert e.media.proj.n_embd == 2 * ll.llama_model_n_embd(e.m.model)
        prompt, imgs = f"see {M} it is", [picture(10, (96, 64))]
        _, _, deltas = run_engine(e, [raw("q3", prompt, *imgs)])
        assert tokens_of(deltas, "q3") == reference(e, prompt, imgs)
    finally:
        e.close()
