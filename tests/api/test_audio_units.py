"""The router's audio pieces without a server: the container sniff, the windows of a long
recording, SRT/VTT stamps, the multipart form's checks, the decoding child's bounds."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from corral.api.core.audio import (RATE, WINDOW_SAMPLES, AudioBudget, Pcm, check_format, decode_audio, sniff,
                                   windows)
from corral.api.openai.audio_form import TranscriptionForm, parse_form
from corral.api.openai.audio_routes import srt, vtt
from corral.config.file import ServerConfig
from corral.errors import InvalidAudio, InvalidRequest, PayloadTooLarge
from testkit.audio_files import FORMATS, encode, recording


def test_sniff_names_each_container_and_nothing_else() -> None:
    want = {"wav": "wav", "mp3": "mp3", "flac": "flac", "ogg": "ogg", "webm": "matroska", "m4a": "mov", "mp4": "mov"}
    clip = recording(0.5)
    for fmt in FORMATS:
        assert sniff(encode(clip, fmt)) == want[fmt], fmt
    for not_audio in (b"\x89PNG\r\n\x1a\n" + bytes(20), b"\xff\xd8\xff\xe0" + bytes(20), b"GIF89a",
                      b"\x00\x00\x00\x18ftypheic" + bytes(8), b"", b"%PDF-1.7"):
        assert sniff(not_audio) is None
    with pytest.raises(InvalidAudio, match="not 'wav'"):
        check_format(encode(clip, "mp3"), "file", "wav")
    assert check_format(encode(clip, "webm"), "file", "webm") == "matroska"


def test_windows_cut_long_recordings_at_pauses_within_30_s() -> None:
    samples = recording(125)  # 0.8 s tone, 0.2 s pause, every second
    cuts = windows(Pcm(samples))
    assert len(cuts) == 5  # as few as whole windows allow: ceil(125 / 30)
    assert cuts[0][0] == 0 and cuts[-1][1] == len(samples)
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    assert all(b - a <= WINDOW_SAMPLES for a, b in cuts)
    for _, end in cuts[:-1]:  # each cut falls in a pause (the tone is off 0.8 .. 1.0 s of each second)
        assert 0.8 <= (end / RATE) % 1.0 < 1.0
    assert windows(Pcm(recording(29.5))) == [(0, int(29.5 * RATE))]
    full = np.zeros(WINDOW_SAMPLES, dtype=np.int16)
    assert windows(Pcm(full)) == [(0, WINDOW_SAMPLES)]
    # 30.0 s is two encoder windows to libmtmd (tests/worker/test_audio_engine.py): two windows
    # here too, cut at a pause, never one of 30 s that spills 10 ms into 750 more positions
    thirty = windows(Pcm(recording(30)))
    assert len(thirty) == 2 and all(b - a <= WINDOW_SAMPLES for a, b in thirty)
    quiet = windows(Pcm(np.zeros(61 * RATE, dtype=np.int16)))  # no pause to find: still within a window
    assert len(quiet) == 3 and all(b - a <= WINDOW_SAMPLES for a, b in quiet)


def test_srt_and_vtt_stamps() -> None:
    segs = [{"start": 0.0, "end": 29.5, "text": " one "}, {"start": 29.5, "end": 3725.25, "text": "two"}]
    assert srt(segs) == "1\n00:00:00,000 --> 00:00:29,500\none\n\n2\n00:00:29,500 --> 01:02:05,250\ntwo\n\n"
    assert vtt(segs).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:29.500\none\n\n00:00:29.500 --> 01:02:05.250\n")


def _form(parts: list[tuple[str, str | None, bytes]], boundary: str = "XyZ") -> bytes:
    out = b""
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_form_fields_files_and_counts() -> None:
    ct = "multipart/form-data; boundary=XyZ"
    body = _form([("model", None, b"m"), ("file", "a.wav", b"RIFF...."), ("response_format", None, b"srt"),
                  ("timestamp_granularities[]", None, b"segment"), ("temperature", None, b"0.2")])
    f = TranscriptionForm.of(parse_form(body, ct, 16), translate=False)
    assert (f.model, f.file.filename, f.file.data, f.response_format, f.temperature) == ("m", "a.wav", b"RIFF....",
                                                                                          "srt", 0.2)
    with pytest.raises(InvalidRequest, match="more than 2 files"):
        parse_form(_form([("file", f"{i}.wav", b"x") for i in range(3)]), ct, 2)
    with pytest.raises(InvalidRequest, match="stream"):
        TranscriptionForm.of(parse_form(_form([("model", None, b"m"), ("file", "a", b"x"),
                                               ("response_format", None, b"srt"), ("stream", None, b"true")]), ct, 4),
                             translate=False)
    with pytest.raises(InvalidRequest, match="multipart"):
        parse_form(b"{}", "application/json", 4)
    with pytest.raises(InvalidRequest, match="64 fields"):
        parse_form(_form([("x", None, b"1")] * 65), ct, 4)


def test_the_child_bounds_time_bytes_and_duration() -> None:
    srv = ServerConfig(max_audio_bytes=200_000, max_audio_s=10, audio_decode_timeout_s=30)
    pcm = asyncio.run(decode_audio(encode(recording(3), "ogg"), "file", srv, AudioBudget.of(srv)))
    assert abs(pcm.seconds - 3.0) < 0.1
    budget = AudioBudget.of(srv)
    asyncio.run(decode_audio(encode(recording(6), "flac"), "a", srv, budget))
    with pytest.raises(InvalidAudio, match="longer than the 4 s"):  # the request's 10 s: 6 used, 4 left
        asyncio.run(decode_audio(encode(recording(6), "flac"), "b", srv, budget))
    with pytest.raises(PayloadTooLarge, match="max_audio_bytes"):
        asyncio.run(decode_audio(bytes(200_001), "c", srv, AudioBudget.of(srv)))
    slow = ServerConfig(audio_decode_timeout_s=0.0001)  # under a fork and a 30 s decode anywhere
    with pytest.raises(InvalidAudio, match="did not decode within"):
        asyncio.run(decode_audio(encode(recording(30), "mp3"), "d", slow, AudioBudget.of(slow)))
