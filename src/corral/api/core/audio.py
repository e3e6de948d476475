"""Audio in requests, in the router: untrusted media files to 16 kHz mono PCM, bounded.

Every dialect's audio (a chat ``input_audio`` part, an Ollama ``images`` entry that sniffs
as audio, a Responses ``input_audio`` part, a ``/completion`` multimodal item, the file of
``/v1/audio/transcriptions``) arrives here as bytes and the field it came from. Then:

1. ``sniff(data)``: the container from the file's first bytes (WAV, MP3, FLAC, Ogg,
   Matroska/WebM, MP4/M4A, ADTS AAC); anything else is a 400 naming the part, and a
   declared ``format`` that the bytes contradict is one too;
2. ``decode_audio``: the file goes to a child process (``api/core/audio_child.py``: PyAV,
   i.e. FFmpeg's demuxer for that one container and its decoders, forked for that file by
   the decoder's parent, ``Decoder``) that writes 16 kHz mono s16 samples back. The child
   has an address-space and a CPU-time bound of its own and the router a wall-clock one
   (``[server] audio_decode_timeout_s``): a decoder that crashes, loops or balloons ends
   the child, never the router, and is a 400 naming the part. It stops at
   ``max_audio_s`` (what the request's other files left): a small file that decodes to hours is refused while it is decoded, not after;
3. the bounds before any decoding: ``max_audio_files_per_request`` (400),
   ``max_audio_bytes`` a file and ``max_audio_bytes_per_request`` together (413);
4. the worker gets each recording as a 16 kHz mono 16-bit WAV (``wav_bytes``), the one
   format its decoder (libmtmd's miniaudio) then reads, in the request's media list at
   the recording's marker.

``windows(pcm)`` cuts a long recording into windows of one encoder window each (30 s less
10 ms, ``WINDOW_SAMPLES``) for the transcription routes (api/openai/audio_routes.py), each cut on the quietest 100 ms of the last 5 s before it.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from corral.api.core import audio_child
from corral.config.file import ServerConfig
from corral.errors import InternalError, InvalidAudio, InvalidRequest, PayloadTooLarge

__all__ = ["RATE", "WINDOW_SAMPLES", "AudioBudget", "Pcm", "sniff", "check_format", "decode_audio", "decode_recordings",
           "wav_bytes", "windows", "is_audio", "FORMATS", "Decoder", "DECODER"]

RATE = 16_000
# The most samples one window of a Whisper-style encoder holds: libmtmd's mel
# (tools/mtmd/mtmd-audio.cpp) pads a recording with 30 s of silence and 200 samples at each
# end, takes (n + 480,000) // 160 + 1 frames and encodes each whole 3,000 of them as a window:
# 479,839 samples (30 s less 161) are one window, 30.0 s are two (10 ms of sound and 29.99 s
# of padding, 750 more positions for nothing)
WINDOW_SAMPLES = 30 * RATE - 161
_SEARCH_S = 5.0  # a cut looks this far back from the window's end for silence
_FRAME = RATE // 10  # 100 ms: the unit the cut's loudness is measured in
_CPU_S = 120  # the child's CPU seconds (the wall-clock bound is the config's)

# a client's declared format (OpenAI's input_audio.format, a file's name) -> the container
FORMATS = {"wav": "wav", "wave": "wav", "mp3": "mp3", "mpeg": "mp3", "mpga": "mp3", "flac": "flac",
           "ogg": "ogg", "oga": "ogg", "opus": "ogg", "webm": "matroska", "mka": "matroska",
           "mkv": "matroska", "mp4": "mov", "m4a": "mov", "aac": "aac"}


def sniff(data: bytes) -> str | None:
    """The container the bytes start as (an FFmpeg demuxer name), None if not audio we read."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "matroska"
    if data[4:8] == b"ftyp":  # ISO media: MP4/M4A audio, unless a picture's brand (HEIC, AVIF)
        return None if data[8:12] in (b"heic", b"heix", b"mif1", b"heif", b"avif", b"msf1") else "mov"
    if data[:3] == b"ID3":
        return "mp3"
    if len(data) >= 2 and data[0] == 0xFF:
        if data[1] & 0xF6 == 0xF0:  # ADTS: sync 12 bits, layer 00
            return "aac"
        if data[1] & 0xE0 == 0xE0:  # MPEG audio frame sync (layer bits not 00)
            return "mp3"
    return None


def is_audio(data: bytes) -> bool:
    """Whether a media file (Ollama's ``images`` carry either) is audio rather than a picture."""
    return sniff(data) is not None


@dataclass
class Pcm:
    """A decoded recording: 16 kHz mono 16-bit samples."""

    samples: npt.NDArray[np.int16]

    @property
    def seconds(self) -> float:
        return len(self.samples) / RATE


@dataclass
class AudioBudget:
    """What a request's recordings may take together: files, encoded bytes, decoded seconds."""

    files: int
    bytes: int
    seconds: float

    @classmethod
    def of(cls, srv: ServerConfig) -> AudioBudget:
        return cls(srv.max_audio_files_per_request, srv.max_audio_bytes_per_request, srv.max_audio_s)

    def take_file(self, n_bytes: int, where: str, srv: ServerConfig) -> None:
        if self.files <= 0:
            raise InvalidRequest(f"{where}: the request has more than {srv.max_audio_files_per_request} audio files "
                                 "(max_audio_files_per_request)", param=where)
        if n_bytes > srv.max_audio_bytes:
            raise PayloadTooLarge(f"{where}: the audio file is larger than {srv.max_audio_bytes} bytes "
                                  "(max_audio_bytes)", param=where)
        if n_bytes > self.bytes:
            raise PayloadTooLarge(f"{where}: the request's audio files hold more than "
                                  f"{srv.max_audio_bytes_per_request} bytes together (max_audio_bytes_per_request)",
                                  param=where)
        self.files -= 1
        self.bytes -= n_bytes


def check_format(data: bytes, where: str, declared: str | None) -> str:
    """The container to decode ``data`` as; 400s for an empty file, bytes that are no audio
    this server reads, and a declared format the bytes contradict."""
    if not data:
        raise InvalidAudio(f"{where}: the audio file is empty", param=where)
    container = sniff(data)
    if container is None:
        raise InvalidAudio(f"{where}: not an audio file in a format this server reads (WAV, MP3, FLAC, Ogg "
                           "Vorbis/Opus, WebM, MP4/M4A, AAC)", param=where)
    if declared is not None:
        want = FORMATS.get(declared.lower().strip())
        if want is None:
            raise InvalidAudio(f"{where}: format {declared!r} is not one this server reads "
                               f"({', '.join(sorted(FORMATS))})", param=where)
        if want != container and not {want, container} <= {"mp3", "aac"}:
            raise InvalidAudio(f"{where}: the file is {container} audio, not {declared!r} as its format says",
                               param=where)
    return container


class Decoder:
    """The router's audio decoder: one parent process (``audio_child.serve``, PyAV loaded)
    that forks a child for each file. Started on the first file, started again when it has
    gone; it exits when the router does (its socket closes). Not bound to an event loop:
    the job's socket is."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def _start(self) -> socket.socket:
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "corral.api.core.audio_child"], stdin=theirs.fileno(), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                env={k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG")})
        self._control = ours
        return ours

    def job(self, container: str, max_samples: int, max_as: int, cpu_s: int) -> socket.socket:
        """A socket to a new child that decodes one file (``audio_child``'s protocol)."""
        msg = audio_child.JOB.pack(container.encode(), max_samples, max_as, cpu_s)
        mine, child = socket.socketpair()
        with child:
            for attempt in (0, 1):
                control = self._control
                if control is None or self._proc is None or self._proc.poll() is not None:
                    control = self._start()
                try:
                    socket.send_fds(control, [msg], [child.fileno()])
                    break
                except OSError:
                    if attempt:
                        mine.close()
                        raise
                    self.close()  # gone since: once more with a new one
        return mine

    def close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None


DECODER = Decoder()


async def decode_audio(data: bytes, where: str, srv: ServerConfig, budget: AudioBudget,
                       declared: str | None = None) -> Pcm:
    """``data`` (an untrusted media file) as 16 kHz mono PCM, within ``budget``; the
    module's errors, each naming ``where``."""
    budget.take_file(len(data), where, srv)
    container = check_format(data, where, declared)
    max_samples = int(budget.seconds * RATE)
    if max_samples <= 0:
        raise InvalidAudio(f"{where}: the request's recordings are longer than {srv.max_audio_s:g} s together "
                           "(max_audio_s)", param=where)
    try:
        sock = DECODER.job(container, max_samples, int(srv.audio_decode_memory), _CPU_S)
    except OSError as exc:
        raise InternalError(f"the audio decoder could not be started ({type(exc).__name__})") from None
    loop = asyncio.get_running_loop()
    pid = 0
    reply = bytearray()
    try:
        sock.setblocking(False)
        async with asyncio.timeout(srv.audio_decode_timeout_s):
            head = await _recv_exactly(loop, sock, audio_child.LEN.size)
            if head is not None:
                (pid,) = audio_child.LEN.unpack(head)
                await loop.sock_sendall(sock, audio_child.LEN.pack(len(data)) + data)
                limit = audio_child.REPLY.size + 1024 + 2 * max_samples
                while len(reply) <= limit and (chunk := await loop.sock_recv(sock, 1 << 20)):
                    reply += chunk
    except TimeoutError:
        raise InvalidAudio(f"{where}: the audio file did not decode within {srv.audio_decode_timeout_s:g} s "
                           "(audio_decode_timeout_s)", param=where) from None
    except OSError:
        reply.clear()  # the child went away mid-file: it crashed
    finally:
        sock.close()
        if pid > 0:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # ended already, or stuck
    n = audio_child.REPLY.size
    if len(reply) < n:
        raise InvalidAudio(f"{where}: the {container} audio could not be read: the decoder failed on it (a corrupt "
                           "or hostile file)", param=where)
    code, n_reason = audio_child.REPLY.unpack_from(reply)
    reason = bytes(reply[n: n + n_reason]).decode("utf-8", "replace")
    if code == audio_child.LONG:
        raise InvalidAudio(f"{where}: the recording is longer than the {budget.seconds:g} s the request may "
                           f"have left (max_audio_s: {srv.max_audio_s:g} s a request; it runs {reason})",
                           param=where)
    if code != audio_child.OK:
        raise InvalidAudio(f"{where}: the {container} audio could not be read: {reason}", param=where)
    samples = np.frombuffer(bytes(reply[n + n_reason:]), dtype="<i2").copy()
    budget.seconds -= len(samples) / RATE
    return Pcm(samples)


async def _recv_exactly(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = await loop.sock_recv(sock, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _base64(url: str, where: str, max_bytes: int) -> bytes:
    """A recording's bytes from its ``data:`` URL (the dialects put a base64 payload in one)."""
    text = "".join(url.partition(",")[2].split())
    if len(text) // 4 * 3 > max_bytes + 2:
        raise PayloadTooLarge(f"{where}: the audio file is larger than {max_bytes} bytes (max_audio_bytes)",
                              param=where)
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidAudio(f"{where}: the audio's base64 is not valid ({exc})", param=where) from None


async def decode_recordings(refs: Sequence[tuple[str, str, str | None]], srv: ServerConfig) -> list[bytes]:
    """Each recording of a request (its ``data:`` URL, the field it came from, its declared
    format) as the WAV the worker gets, decoded one after another within the request's
    budget; the count and the encoded bytes are checked for all of them before any is decoded."""
    if len(refs) > srv.max_audio_files_per_request:
        where = refs[srv.max_audio_files_per_request][1]
        raise InvalidRequest(f"{where}: the request has {len(refs)} audio files, more than the "
                             f"{srv.max_audio_files_per_request} allowed (max_audio_files_per_request)", param=where)
    total = 0
    for url, where, _ in refs:
        total += len("".join(url.partition(",")[2].split())) // 4 * 3
        if total > srv.max_audio_bytes_per_request + 2:
            raise PayloadTooLarge(f"{where}: the request's audio files hold more than "
                                  f"{srv.max_audio_bytes_per_request} bytes together (max_audio_bytes_per_request)",
                                  param=where)
    budget = AudioBudget.of(srv)
    out: list[bytes] = []
    for url, where, declared in refs:
        raw = _base64(url, where, srv.max_audio_bytes)
        out.append(wav_bytes(await decode_audio(raw, where, srv, budget, declared)))
    return out


def wav_bytes(pcm: Pcm) -> bytes:
    """``pcm`` as a 16 kHz mono 16-bit WAV file (what the worker's decoder reads)."""
    body = pcm.samples.astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, RATE, RATE * 2, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + len(body)) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"data" + struct.pack("<I", len(body)) + body)


def windows(pcm: Pcm, size: int = WINDOW_SAMPLES) -> list[tuple[int, int]]:
    """Sample ranges (start, end) of at most ``size`` samples (one encoder window) each
    covering ``pcm``, as few as whole windows allow: each cut aims at an even share of what
    is left and goes on the quietest 100 ms of the 5 s around that aim (never past ``size``
    from the window's start): speech rarely pauses exactly at the aim, and a pause nearby is
    a better place to cut than the middle of a word."""
    n = len(pcm.samples)
    search = int(_SEARCH_S * RATE)
    out: list[tuple[int, int]] = []
    start = 0
    while n - start > size:
        left = -(-(n - start) // size)  # windows still needed
        aim = start + (n - start) // left
        hi = min(start + size, aim + search // 2)
        lo = max(start + _FRAME, hi - search)
        seg = pcm.samples[lo:hi].astype(np.float32)
        frames = seg[: len(seg) // _FRAME * _FRAME].reshape(-1, _FRAME)
        energy = (frames * frames).mean(axis=1)
        quiet = len(energy) - 1 - int(np.argmin(energy[::-1]))  # the latest of equally quiet frames
        cut = lo + quiet * _FRAME + _FRAME // 2  # the middle of that frame
        out.append((start, cut))
        start = cut
    out.append((start, n))
    return out
