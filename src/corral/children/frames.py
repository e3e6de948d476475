"""Framing shared by corral's two private channels: router <-> worker (``corral.wire``)
and router <-> download child (``corral.store.messages``).

A frame is a 4-byte big-endian length followed by that many bytes of body (msgpack of
a tagged msgspec struct; the body is the caller's business). Each channel has its own
largest body. This module imports nothing of corral.
"""

from __future__ import annotations

import struct

__all__ = ["HEADER", "FrameTooLarge", "FrameDecoder", "frame"]

HEADER = struct.Struct(">I")


class FrameTooLarge(ValueError):
    pass


def frame(body: bytes, max_frame: int) -> bytes:
    """One frame around ``body``. ``FrameTooLarge`` beyond ``max_frame``."""
    if len(body) > max_frame:
        raise FrameTooLarge(f"message of {len(body)} bytes exceeds {max_frame}")
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental splitter: ``feed(data)`` returns the complete frame bodies so far.
    ``max_frame``: the largest body accepted."""

    def __init__(self, max_frame: int) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            if n > self._max:
                raise FrameTooLarge(f"incoming frame of {n} bytes exceeds {self._max}")
            end = HEADER.size + n
            if len(self._buf) < end:
                break
            out.append(bytes(self._buf[HEADER.size : end]))
            del self._buf[:end]
        return out
