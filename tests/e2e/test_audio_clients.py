"""Speech through corral with the official clients: the openai SDK's
``audio.transcriptions.create`` (each response_format, streamed and not) and
``audio.translations.create``, chat ``input_audio`` parts, and the ollama client's
``images`` carrying a recording, in front of a real worker with the embedded Gemma 3 and a
real (random-weight) Qwen2-Audio projector (testkit/gguf_audio.py), real libmtmd, real
PyAV decoding. The words are meaningless (random weights); that the audio reached the
model shows in the prompt's token count (750 positions a started 30 s window)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from support.harness import Harness
from testkit.audio_files import encode, recording
from testkit.gguf_audio import WINDOW_TOKENS

pytestmark = pytest.mark.integration


async def start(harness: Harness, model_path: Path, audio_mmproj_path: Path, **server: Any) -> None:
    cfg = harness.config({"gemma-audio": {"path": str(model_path), "mmproj": str(audio_mmproj_path),
                                          "ctx_len": 4096, "n_parallel": 2, "threads": 1},
                          "gemma-text": {"path": str(model_path), "mmproj": "", "ctx_len": 512, "n_parallel": 1,
                                         "threads": 1}},
                         worker_command=None, **server)
    await harness.start(cfg)


def client(harness: Harness) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)


async def test_transcriptions_each_format(harness: Harness, model_path: Path, audio_mmproj_path: Path) -> None:
    await start(harness, model_path, audio_mmproj_path)
    c = client(harness)
    models = {m.id: m for m in (await c.models.list()).data}
    assert models["gemma-audio"].model_extra["audio"] is True  # type: ignore[index]
    assert models["gemma-audio"].model_extra["vision"] is False  # type: ignore[index]
    assert models["gemma-text"].model_extra["audio"] is False  # type: ignore[index]
    wav = encode(recording(2), "wav")
    extra = {"max_tokens": 3}

    r = await c.audio.transcriptions.create(model="gemma-audio", file=("a.wav", wav), extra_body=extra)
    assert isinstance(r.text, str)
    usage = r.usage
    assert usage is not None and usage.type == "tokens"
    assert usage.input_tokens >= WINDOW_TOKENS  # the window's 750 positions were in the prompt
    assert 1 <= usage.output_tokens <= 3

    text = await c.audio.transcriptions.create(model="gemma-audio", file=("a.wav", wav), response_format="text",
                                               extra_body=extra)
    assert isinstance(text, str)
    srt = await c.audio.transcriptions.create(model="gemma-audio", file=("a.wav", wav), response_format="srt",
                                              extra_body=extra)
    assert srt.startswith("1\n00:00:00,000 --> 00:00:02,000\n")
    vtt = await c.audio.transcriptions.create(model="gemma-audio", file=("a.wav", wav), response_format="vtt",
                                              extra_body=extra)
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n")
    verbose = await c.audio.transcriptions.create(model="gemma-audio", file=("a.wav", wav),
                                                  response_format="verbose_json",
                                                  timestamp_granularities=["segment"], extra_body=extra)
    assert verbose.duration == pytest.approx(2.0)
    assert [(s.start, s.end) for s in verbose.segments or []] == [(0.0, 2.0)]

    events = []
    stream = await c.audio.transcriptions.create(model="gemma-audio", file=("a.webm", encode(recording(2), "webm")),
                                                 stream=True, extra_body=extra)
    async for ev in stream:
        events.append(ev)
    assert events and events[-1].type == "transcript.text.done"
    assert all(e.type == "transcript.text.delta" for e in events[:-1])
    done: Any = events[-1]
    assert done.text == "".join(e.delta for e in events[:-1]).strip()
    assert done.usage.input_tokens >= WINDOW_TOKENS

    tr = await c.audio.translations.create(model="gemma-audio", file=("a.mp3", encode(recording(2), "mp3")),
                                           extra_body=extra)
    assert isinstance(tr.text, str)


async def test_long_recording_is_windows_side_by_side(harness: Harness, model_path: Path,
                                                      audio_mmproj_path: Path) -> None:
    await start(harness, model_path, audio_mmproj_path)
    c = client(harness)
    # 65 s: three windows (about 22 s each, cut at pauses), each 750 positions
    verbose = await c.audio.transcriptions.create(model="gemma-audio", file=("long.flac", encode(recording(65), "flac")),
                                                  response_format="verbose_json", extra_body={"max_tokens": 2})
    segs = verbose.segments or []
    assert len(segs) == 3
    assert segs[0].start == 0.0 and segs[-1].end == pytest.approx(65.0)
    assert all(a.end == b.start for a, b in zip(segs, segs[1:]))
    assert all(15.0 <= s.end - s.start <= 30.0 for s in segs)  # an even share each, cut at a pause
    r = await c.audio.transcriptions.create(model="gemma-audio", file=("long.flac", encode(recording(65), "flac")),
                                            extra_body={"max_tokens": 2})
    assert r.usage is not None and r.usage.input_tokens >= 3 * WINDOW_TOKENS  # type: ignore[union-attr]


async def test_transcription_asks_what_llama_server_asks(harness: Harness, model_path: Path,
                                                        audio_mmproj_path: Path) -> None:
    """A transcription's window is the user turn llama-server builds for one
    (tools/server's convert_transcriptions_to_chatcmpl): "Transcribe audio to text", the
    language in brackets, the audio right after; so its prompt is that chat's, token for token
    (bench/checks/audio.py compares the two servers themselves)."""
    await start(harness, model_path, audio_mmproj_path)
    c = client(harness)
    wav = encode(recording(2), "wav")
    b64 = base64.b64encode(wav).decode()
    for language, ask in ((None, "Transcribe audio to text"), ("de", "Transcribe audio to text (language: de)")):
        lang: dict[str, Any] = {"language": language} if language else {}
        r = await c.audio.transcriptions.create(model="gemma-audio", file=("a.wav", wav), temperature=0,
                                                extra_body={"max_tokens": 1}, **lang)
        chat = await c.chat.completions.create(model="gemma-audio", max_tokens=1, temperature=0, messages=[
            {"role": "user", "content": [{"type": "text", "text": ask},
                                         {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}]}])
        assert r.usage is not None and chat.usage is not None
        assert r.usage.input_tokens == chat.usage.prompt_tokens, language  # type: ignore[union-attr]


async def test_chat_input_audio_and_ollama(harness: Harness, model_path: Path, audio_mmproj_path: Path) -> None:
    await start(harness, model_path, audio_mmproj_path)
    c = client(harness)
    b64 = base64.b64encode(encode(recording(1), "wav")).decode()
    text_only = await c.chat.completions.create(model="gemma-audio", max_tokens=3, temperature=0,
                                                messages=[{"role": "user", "content": "What is said?"}])
    r = await c.chat.completions.create(model="gemma-audio", max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is said?"},
                                     {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}]}])
    assert r.usage is not None and text_only.usage is not None
    assert r.usage.prompt_tokens >= text_only.usage.prompt_tokens + WINDOW_TOKENS
    # 31 s: two windows of one recording
    b64_long = base64.b64encode(encode(recording(31), "mp3")).decode()
    r2 = await c.chat.completions.create(model="gemma-audio", max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": b64_long, "format": "mp3"}},
                                     {"type": "text", "text": "What is said?"}]}])
    assert r2.usage is not None and r2.usage.prompt_tokens >= text_only.usage.prompt_tokens + 2 * WINDOW_TOKENS

    # a model without an audio encoder: 400 audio_not_supported, OpenAI's shape
    with pytest.raises(openai.BadRequestError) as err:
        await c.chat.completions.create(model="gemma-text", max_tokens=3, messages=[
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}}]}])
    assert err.value.code == "audio_not_supported" and err.value.param == "messages.0.content.0"

    # the Responses API's input_audio part
    resp = await harness.client.post("/v1/responses", json={"model": "gemma-audio", "max_output_tokens": 3, "input": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}},
                                     {"type": "input_text", "text": "What is said?"}]}]})
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["input_tokens"] >= WINDOW_TOKENS

    o = ollama.AsyncClient(host=harness.base_url)
    reply = await o.chat(model="gemma-audio", options={"num_predict": 3, "temperature": 0},
                         messages=[{"role": "user", "content": "What is said?", "images": [b64]}])
    assert reply.prompt_eval_count is not None and reply.prompt_eval_count >= WINDOW_TOKENS
    show = await o.show("gemma-audio")
    assert "audio" in (show.capabilities or [])
    props = await harness.client.get("/props", params={"model": "gemma-audio"})
    assert props.json()["modalities"] == {"vision": False, "audio": True}
