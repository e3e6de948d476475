"""The audio decoding child: one untrusted media file in, 16 kHz mono PCM out.

Run by ``corral.api.core.audio`` (``decode_audio``) as ``python -m corral.api.core.audio_child
CONTAINER MAX_SAMPLES MAX_AS_BYTES CPU_S``: the file's bytes on stdin, signed 16-bit little-endian
samples on stdout, a one-line reason on stderr. Before it parses a byte it lowers its own
limits (address space, CPU seconds, no core files, no new files), so a decoder that
loops, balloons or crashes ends this process only; the router reads the exit status:

- 0: the samples are on stdout;
- 2: the bytes are not audio this server reads, or are cut short of the length their
  header declares (the reason on stderr);
- 3: the recording is longer than ``MAX_SAMPLES`` (stopped there: a small file that
  decodes to hours is never decoded in full; the container's declared duration, when it
  has one, refuses it before any frame is decoded).

PyAV (FFmpeg's demuxers and decoders) opens only the container the router sniffed
(``CONTAINER``: wav, mp3, flac, ogg, matroska, mov, aac); FFmpeg never probes other
demuxers (the playlist and concat ones would open further files), decodes the first audio
stream only, on one thread, and resamples it to 16 kHz mono s16.
"""

from __future__ import annotations

import io
import resource
import sys

__all__ = ["main"]

RATE = 16_000
EXIT_BAD, EXIT_LONG = 2, 3


def _limit(max_as: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (max_as, max_as))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # stdout is a pipe, not a file


def _fail(code: int, reason: str) -> int:
    sys.stderr.write(reason.replace("\n", " ")[:300] + "\n")
    sys.stderr.flush()
    return code


def main(argv: list[str]) -> int:
    container, max_samples, max_as, cpu_s = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    data = sys.stdin.buffer.read()
    _limit(max_as, cpu_s)
    import av  # after the limits: its libraries map under them too

    av.logging.set_level(None)  # FFmpeg's own log lines are not the reason a client reads
    out = sys.stdout.buffer
    try:
        with av.open(io.BytesIO(data), mode="r", format=container, options={"probesize": "5000000"}) as f:
            streams = f.streams.audio
            if not streams:
                return _fail(EXIT_BAD, "the file holds no audio stream")
            stream = streams[0]
            stream.codec_context.thread_type = "NONE"  # one thread: the router's child, not a pool
            seconds = None
            if f.duration is not None and f.duration > 0:
                seconds = f.duration / av.time_base
            elif stream.duration is not None and stream.time_base is not None:
                seconds = float(stream.duration * stream.time_base)
            if seconds is not None and seconds * RATE > max_samples:
                return _fail(EXIT_LONG, f"{seconds:.0f} s")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
            n = 0
            for frame in f.decode(stream):
                for piece in resampler.resample(frame):
                    pcm = piece.to_ndarray().tobytes()
                    n += len(pcm) // 2
                    if n > max_samples:
                        return _fail(EXIT_LONG, f"more than {max_samples // RATE} s")
                    out.write(pcm)
            for piece in resampler.resample(None):
                pcm = piece.to_ndarray().tobytes()
                n += len(pcm) // 2
                if n > max_samples:
                    return _fail(EXIT_LONG, f"more than {max_samples // RATE} s")
                out.write(pcm)
    except MemoryError:
        return _fail(EXIT_BAD, "decoding it needs more memory than a request may use")
    except av.FFmpegError as exc:
        return _fail(EXIT_BAD, f"it could not be decoded ({exc.strerror})")
    except (ValueError, EOFError, OSError) as exc:
        return _fail(EXIT_BAD, f"it could not be decoded ({type(exc).__name__})")
    if n < RATE // 10:
        return _fail(EXIT_BAD, f"it decodes to {n / RATE:.3f} s of audio, under the 0.1 s a transcript needs")
    if seconds is not None and n < (seconds - 0.5) * RATE * 0.9:
        return _fail(EXIT_BAD, f"it is truncated: it declares {seconds:.1f} s and holds {n / RATE:.1f} s")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
