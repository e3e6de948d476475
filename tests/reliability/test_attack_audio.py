"""Hostile and broken audio through a real router and worker: a truncated file, bytes that
are not audio, a decoder bomb (a small file that decodes to an hour and says nothing of its
length up front), 0 bytes, a declared format the bytes contradict, 200 files, and an hour of
audio where the bound is 10 minutes. Each is a 4xx naming the part, in the shape of the API
it came in on (api/core/audio.py decodes in a bounded child process); the same server then
transcribes a good file."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from support.harness import Harness
from testkit.audio_files import decoder_bomb, encode, recording, silence

pytestmark = pytest.mark.integration


@pytest.fixture
async def server(harness: Harness, model_path: Path, audio_mmproj_path: Path) -> Harness:
    cfg = harness.config({"gemma-audio": {"path": str(model_path), "mmproj": str(audio_mmproj_path),
                                          "ctx_len": 2048, "n_parallel": 2, "threads": 1}},
                         worker_command=None, max_audio_s=600)
    await harness.start(cfg)
    return harness


async def transcribe(h: Harness, data: bytes, name: str = "a.wav", **fields: str) -> Any:
    return await h.client.post("/v1/audio/transcriptions", data={"model": "gemma-audio", "max_tokens": "2", **fields},
                               files={"file": (name, data)}, timeout=120)


def chat_audio(data: bytes, fmt: str | None = "wav", n: int = 1) -> dict[str, Any]:
    part: dict[str, Any] = {"data": base64.b64encode(data).decode()}
    if fmt is not None:
        part["format"] = fmt
    return {"model": "gemma-audio", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": part}] * n}]}


def refused(r: Any, status: int, param: str, words: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert "Traceback" not in r.text and "/corral/" not in r.text


async def test_bad_files_are_400s_naming_the_part(server: Harness) -> None:
    h = server
    mp3 = encode(recording(3), "mp3")
    refused(await transcribe(h, mp3[: len(mp3) // 3], "a.mp3"), 400, "file", "truncated")
    refused(await transcribe(h, b"GIF89a" + bytes(500), "a.wav"), 400, "file", "not an audio file")
    refused(await transcribe(h, b"", "a.wav"), 400, "file", "empty")
    refused(await transcribe(h, mp3, "a.wav"), 400, "file", "not 'wav'")
    refused(await transcribe(h, b"RIFF\x00\x00\x00\x00WAVE" + bytes(40)), 400, "file", "could not be read")
    # an hour where the bound is 10 minutes: refused from the header (FLAC declares it) ...
    refused(await transcribe(h, silence(3600), "a.flac"), 400, "file", "longer than")
    # ... and a bomb that does not declare it: refused while it decodes, at the bound
    refused(await transcribe(h, decoder_bomb(3600), "a.flac"), 400, "file", "longer than")

    url = "/v1/chat/completions"
    refused(await h.client.post(url, json=chat_audio(mp3, "wav")), 400, "messages.0.content.0", "not 'wav'")
    refused(await h.client.post(url, json=chat_audio(mp3, "aiff")), 400, "messages.0.content.0", "aiff")
    refused(await h.client.post(url, json=chat_audio(b"\x00" * 64, None)), 400, "messages.0.content.0",
            "not an audio file")
    refused(await h.client.post(url, json=chat_audio(encode(recording(0.5), "wav"), n=200)), 400,
            "messages.0.content.16", "max_audio_files_per_request")
    # 200 files in one transcription form
    files = [("file", (f"{i}.wav", b"RIFF")) for i in range(200)]
    r = await h.client.post("/v1/audio/transcriptions", data={"model": "gemma-audio"}, files=files)
    refused(r, 400, "file", "more than 16 files")
    # Ollama's shape for Ollama's route
    r = await h.client.post("/api/chat", json={"model": "gemma-audio", "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": [base64.b64encode(mp3[:400]).decode()]}]})
    assert r.status_code == 400 and "messages.0.images.0" in r.json()["error"], r.text

    # the same server still hears a good file
    ok = await transcribe(h, encode(recording(2), "wav"))
    assert ok.status_code == 200 and ok.json()["usage"]["input_tokens"] >= 750


async def test_form_and_bounds(server: Harness) -> None:
    h = server
    wav = encode(recording(1), "wav")
    r = await h.client.post("/v1/audio/transcriptions", data={"model": "gemma-audio"},
                            files={"audio": ("a.wav", wav)})
    refused(r, 400, "file", "required")
    r = await h.client.post("/v1/audio/transcriptions", data={"model": "gemma-audio"})
    assert r.status_code == 415  # a urlencoded body (no file): not OpenAI's form
    r = await transcribe(h, wav, response_format="xml")
    refused(r, 400, "response_format", "xml")
    r = await transcribe(h, wav, **{"timestamp_granularities[]": "word"})
    refused(r, 400, "timestamp_granularities[]", "segment")
    r = await h.client.post("/v1/audio/transcriptions", json={"model": "gemma-audio"})
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    # multipart is still refused on the other routes (a browser sends it cross-site unasked)
    r = await h.client.post("/v1/chat/completions", data={"model": "gemma-audio"}, files={"f": ("a", b"x")})
    assert r.status_code == 415
