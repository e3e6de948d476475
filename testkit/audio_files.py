"""Audio files made offline for the audio tests and the bench: a tone with pauses, encoded
by PyAV (FFmpeg's encoders) in each container a client sends.

``recording(seconds)`` is 16 kHz mono s16 samples: 440 Hz bursts of 0.8 s separated by
0.2 s of silence (so the windows of a long recording have quiet places to be cut).
``encode(samples, fmt)`` writes them as ``wav``, ``mp3``, ``flac``, ``ogg`` (Opus),
``webm`` (Opus, a browser's MediaRecorder output), ``m4a`` (AAC) or ``mp4``.
"""

from __future__ import annotations

import io
from typing import Any

__all__ = ["FORMATS", "recording", "encode", "silence", "decoder_bomb"]

# our name -> (PyAV container, codec, sample rate the codec takes)
FORMATS = {"wav": ("wav", "pcm_s16le", 16000), "mp3": ("mp3", "libmp3lame", 16000),
           "flac": ("flac", "flac", 16000), "ogg": ("ogg", "libopus", 48000),
           "webm": ("webm", "libopus", 48000), "m4a": ("ipod", "aac", 16000), "mp4": ("mp4", "aac", 16000)}


def recording(seconds: float, rate: int = 16000) -> Any:
    """Tone bursts with pauses, 16-bit mono at ``rate``."""
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    on = (t % 1.0) < 0.8
    return (np.sin(2 * np.pi * 440 * t) * 8000 * on).astype(np.int16)


def encode(samples: Any, fmt: str, rate: int = 16000) -> bytes:
    """``samples`` (16-bit mono at ``rate``) as a file of format ``fmt`` (see FORMATS)."""
    import av
    import numpy as np

    container, codec, codec_rate = FORMATS[fmt]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream: Any = out.add_stream(codec, rate=codec_rate, options={"strict": "experimental"})
        stream.layout = "mono"
        stream.codec_context.open()
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=codec_rate,
                                      frame_size=stream.codec_context.frame_size or None)
        step = 1024
        for i in range(0, len(samples), step * 8):
            part = np.ascontiguousarray(samples[i:i + step * 8].reshape(1, -1))
            frame = av.AudioFrame.from_ndarray(part, format="s16", layout="mono")
            frame.sample_rate = rate
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    out.mux(packet)
        for f in resampler.resample(None):
            for packet in stream.encode(f):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def silence(seconds: float, fmt: str = "flac") -> bytes:
    """``seconds`` of silence as a small file (FLAC: constant subframes, a few bytes per
    4,096 samples): an hour is about 100 KB."""
    import av
    import numpy as np

    container, codec, rate = FORMATS[fmt]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream: Any = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        block = np.zeros((1, 16000), dtype=np.int16)
        for _ in range(int(seconds)):
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def decoder_bomb(seconds: float = 3600) -> bytes:
    """A small file that decodes to ``seconds`` of audio and says nothing of its length
    up front: silence as FLAC, its STREAMINFO's total-samples field zeroed ("unknown", as
    a streaming encoder writes it), so only decoding finds out how long it is."""
    data = bytearray(silence(seconds))
    # fLaC, then the STREAMINFO block header (4 bytes); total samples: the low 36 bits of bytes 13..17
    base = 4 + 4
    data[base + 13] &= 0xF0
    data[base + 14:base + 18] = b"\x00\x00\x00\x00"
    return bytes(data)
