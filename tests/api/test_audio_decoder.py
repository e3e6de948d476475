"""The router's audio decoder (api/core/audio.py ``Decoder``, api/core/audio_child.py): one
parent with PyAV loaded, a forked child for each file, killed or crashed children leave the
parent serving, a parent that went away is started again, and it ends with the router's end
of its socket."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess

import pytest

from corral.api.core import audio_child
from corral.api.core.audio import AudioBudget, Decoder, DECODER, decode_audio
from corral.config.file import ServerConfig
from corral.errors import InvalidAudio
from testkit.audio_files import encode, recording

SRV = ServerConfig()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int) -> None:
    """Until ``pid`` has exited (its pidfd turns readable), at most 30 s."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], 30)
        assert ready, f"process {pid} did not end"
    finally:
        os.close(fd)


def _child_pid(sock: socket.socket) -> int:
    head = b""
    while len(head) < audio_child.LEN.size:
        chunk = sock.recv(audio_child.LEN.size - len(head))
        assert chunk, "the decoder's child closed before it said its pid"
        head += chunk
    (pid,) = audio_child.LEN.unpack(head)
    return int(pid)


def _decode(data: bytes) -> float:
    return asyncio.run(decode_audio(data, "file", SRV, AudioBudget.of(SRV))).seconds


def test_one_parent_a_child_a_file_and_none_left() -> None:
    wav = encode(recording(2), "wav")
    assert abs(_decode(wav) - 2.0) < 0.05
    assert DECODER._proc is not None
    parent = DECODER._proc.pid
    pids = []
    for _ in range(3):
        sock = DECODER.job("wav", 16000 * 10, int(SRV.audio_decode_memory), 120)
        with sock:
            pids.append(_child_pid(sock))
            sock.sendall(audio_child.LEN.pack(len(wav)) + wav)
            reply = b""
            while chunk := sock.recv(1 << 20):
                reply += chunk
        code, n = audio_child.REPLY.unpack_from(reply)
        assert code == audio_child.OK and len(reply) - audio_child.REPLY.size - n == 2 * 32000
    assert len(set(pids)) == 3 and parent not in pids  # a fresh process for each file
    assert DECODER._proc.pid == parent  # and one parent for all
    for pid in pids:  # each ended with its file, and was reaped (no zombie)
        _wait_gone(pid)
        assert not _alive(pid) and not os.path.exists(f"/proc/{pid}")


def test_a_child_that_crashes_fails_its_file_only() -> None:
    wav = encode(recording(2), "wav")
    _decode(wav)
    assert DECODER._proc is not None
    parent = DECODER._proc.pid
    sock = DECODER.job("wav", 16000 * 10, int(SRV.audio_decode_memory), 120)
    with sock:
        pid = _child_pid(sock)
        os.kill(pid, signal.SIGSEGV)  # as a decoder that crashes on a hostile file
        assert sock.recv(1 << 20) == b""  # no reply: the router says the decoder failed on it
    assert DECODER._proc.pid == parent and DECODER._proc.poll() is None
    assert abs(_decode(wav) - 2.0) < 0.05  # the next file decodes


def test_a_parent_that_went_away_is_started_again() -> None:
    wav = encode(recording(1), "wav")
    _decode(wav)
    assert DECODER._proc is not None
    old = DECODER._proc
    old.kill()
    old.wait()
    assert abs(_decode(wav) - 1.0) < 0.05
    assert DECODER._proc is not None and DECODER._proc.pid != old.pid


def test_the_parent_ends_with_the_routers_socket() -> None:
    d = Decoder()
    sock = d.job("wav", 16000, int(SRV.audio_decode_memory), 120)
    sock.close()
    assert d._proc is not None and d._control is not None
    proc = d._proc
    d._control.close()  # what the router's exit does
    d._control = None
    assert proc.wait(timeout=30) == 0
    d._proc = None


def test_the_childs_bounds_are_its_own() -> None:
    """A file that decodes past the most samples is stopped in its child (status LONG), and
    the child is gone after it; the parent goes on."""
    with pytest.raises(InvalidAudio, match="longer than"):
        asyncio.run(decode_audio(encode(recording(3), "flac"), "f", SRV,
                                 AudioBudget(files=1, bytes=1 << 20, seconds=1.0)))
    assert DECODER._proc is not None and DECODER._proc.poll() is None
    for pid in [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(DECODER._proc.pid)],
                                                 capture_output=True, text=True).stdout.split()]:
        _wait_gone(pid)  # the child that refused it ends
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(DECODER._proc.pid)], capture_output=True, text=True)
    assert out.stdout.split() == [], out.stdout  # no child left behind
