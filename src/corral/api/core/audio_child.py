"""The audio decoder: untrusted media files in, 16 kHz mono PCM out, each in a process of its own.

``python -m corral.api.core.audio_child`` is the decoder's parent (``serve``), started once
by the router (``corral.api.core.audio.Decoder``) with PyAV already imported, its stdin a
Unix socket to the router. For each file the router sends one message (``JOB``: the
container, the most samples, the address-space bytes and CPU seconds it may use) with a
socket of its own for that file (``SCM_RIGHTS``); the parent forks, and the child:

1. writes its pid on the file's socket (so the router can kill it at its wall-clock bound),
   reads the file (its length first), and lowers its own limits (address space, CPU
   seconds, no core files, no new files) before it parses a byte: a decoder that loops,
   balloons or crashes ends that child only;
2. answers one reply: a status byte, a one-line reason, the samples (signed 16-bit little
   endian), and exits. Status 0: the samples; 2: the bytes are not audio this server reads,
   or are cut short of the length their header declares; 3: the recording is longer than
   the most samples (stopped there: a small file that decodes to hours is never decoded in
   full; the container's declared duration, when it has one, refuses it before any frame is
   decoded). No reply (the socket closed first): the decoder crashed or was killed.

A fork of a parent that has FFmpeg's libraries loaded costs a few milliseconds where a new
interpreter importing PyAV cost about 0.2 CPU-seconds a file: recordings sent back to back
beside two text streams made the worker's thread governor see a busy neighbour and halve
the streams' decode threads (bench/probes/audio_beside.py). Each file still gets a fresh
address space, forked from a parent that never decodes: nothing of one file outlives its
child. The parent exits when the router's end of its socket closes.

PyAV (FFmpeg's demuxers and decoders) opens only the container the router sniffed
(wav, mp3, flac, ogg, matroska, mov, aac); FFmpeg never probes other demuxers (the playlist
and concat ones would open further files), decodes the first audio stream only, on one
thread, and resamples it to 16 kHz mono s16.
"""

from __future__ import annotations

import io
import os
import resource
import signal
import socket
import struct
import sys

__all__ = ["JOB", "LEN", "REPLY", "OK", "BAD", "LONG", "serve", "decode"]

RATE = 16_000
OK, BAD, LONG = 0, 2, 3
JOB = struct.Struct("<16sqqq")  # container, most samples, address-space bytes, CPU seconds
REPLY = struct.Struct("<BH")  # status, the reason's length (then the reason, then the samples)
LEN = struct.Struct("<q")  # the child's pid (to the router); the file's length (from it)


def _limit(max_as: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (max_as, max_as))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # its output is a socket, not a file


class _Failed(Exception):
    """Why a file is refused (its status and reason)."""

    def __init__(self, code: int, reason: str) -> None:
        self.code, self.reason = code, reason


def decode(data: bytes, container: str, max_samples: int, out: io.BytesIO) -> tuple[int, str]:
    """``data`` decoded into ``out``: (status, reason)."""
    try:
        return _decode(data, container, max_samples, out), ""
    except _Failed as f:
        return f.code, f.reason.replace("\n", " ")[:300]


def _decode(data: bytes, container: str, max_samples: int, out: io.BytesIO) -> int:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", format=container, options={"probesize": "5000000"}) as f:
            streams = f.streams.audio
            if not streams:
                raise _Failed(BAD, "the file holds no audio stream")
            stream = streams[0]
            stream.codec_context.thread_type = "NONE"  # one thread: the router's child, not a pool
            seconds = None
            if f.duration is not None and f.duration > 0:
                seconds = f.duration / av.time_base
            elif stream.duration is not None and stream.time_base is not None:
                seconds = float(stream.duration * stream.time_base)
            if seconds is not None and seconds * RATE > max_samples:
                raise _Failed(LONG, f"{seconds:.0f} s")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
            n = 0
            for frame in f.decode(stream):
                for piece in resampler.resample(frame):
                    pcm = piece.to_ndarray().tobytes()
                    n += len(pcm) // 2
                    if n > max_samples:
                        raise _Failed(LONG, f"more than {max_samples // RATE} s")
                    out.write(pcm)
            for piece in resampler.resample(None):
                pcm = piece.to_ndarray().tobytes()
                n += len(pcm) // 2
                if n > max_samples:
                    raise _Failed(LONG, f"more than {max_samples // RATE} s")
                out.write(pcm)
    except MemoryError:
        raise _Failed(BAD, "decoding it needs more memory than a request may use")
    except av.FFmpegError as exc:
        raise _Failed(BAD, f"it could not be decoded ({exc.strerror})")
    except (ValueError, EOFError, OSError) as exc:
        raise _Failed(BAD, f"it could not be decoded ({type(exc).__name__})")
    if n < RATE // 10:
        raise _Failed(BAD, f"it decodes to {n / RATE:.3f} s of audio, under the 0.1 s a transcript needs")
    if seconds is not None and n < (seconds - 0.5) * RATE * 0.9:
        raise _Failed(BAD, f"it is truncated: it declares {seconds:.1f} s and holds {n / RATE:.1f} s")
    return OK


# 0.2 s of silence as a WAV file
_SILENCE = (b"RIFF" + struct.pack("<I", 36 + 6400) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, RATE, 2 * RATE, 2, 16)
            + b"data" + struct.pack("<I", 6400) + bytes(6400))


def _recv(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _child(conn: socket.socket, job: bytes) -> None:
    """One file, in the forked child (``serve``)."""
    name, max_samples, max_as, cpu_s = JOB.unpack(job)
    conn.sendall(LEN.pack(os.getpid()))
    (n,) = LEN.unpack(_recv(conn, LEN.size))
    data = _recv(conn, n)
    _limit(max_as, cpu_s)
    out = io.BytesIO()
    code, reason = decode(data, name.rstrip(b"\0").decode(), max_samples, out)
    r = reason.encode("utf-8", "replace")
    conn.sendall(REPLY.pack(code, len(r)) + r + (out.getvalue() if code == OK else b""))


def serve(control: socket.socket) -> None:
    """The decoder's parent: a fork for each file the router sends, until it goes away."""
    import av

    av.logging.set_level(None)  # FFmpeg's own log lines are not the reason a client reads
    decode(_SILENCE, "wav", RATE, io.BytesIO())  # what a first decode loads (numpy, FFmpeg's tables), loaded once here
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the children reap themselves
    while True:
        try:
            job, fds, _, _ = socket.recv_fds(control, JOB.size, 1)
        except OSError:
            return
        if not job:
            return  # the router is gone
        if len(job) != JOB.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            code = 1
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                with socket.socket(fileno=fds[0]) as conn:
                    _child(conn, job)
                code = 0
            finally:
                os._exit(code)
        os.close(fds[0])


if __name__ == "__main__":
    serve(socket.socket(fileno=sys.stdin.fileno()))
