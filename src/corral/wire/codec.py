"""The wire's frames: the two unions of messages (``ToWorker``, ``FromWorker``), their
encoding (a ``corral.children.frames`` frame around msgpack of a tagged struct: ``encode``) and
decoding (``decode_to_worker``, ``decode_from_worker``: the concrete struct, so handlers
``match`` on the class), and the channel's largest frame (``MAX_FRAME``).
"""

from __future__ import annotations

from typing import Union

import msgspec

from corral.children import frames
from corral.children.frames import frame
from corral.wire.answers import Delta, Embeddings, Finished, RequestFailed, Tokenized
from corral.wire.cache import PersistCache
from corral.wire.lifecycle import Loading, LoadFailed, Ready, Shutdown, Stats, StatsRequest
from corral.wire.preempt import Paused, Preempt, Resume
from corral.wire.requests import Abort, EmbedRequest, GenerateRequest, TokenizeRequest
from corral.wire.slots import SlotFileAction, SlotFileDone

__all__ = ["ToWorker", "FromWorker", "MAX_FRAME", "encode", "decode_to_worker", "decode_from_worker",
           "FrameDecoder"]

MAX_FRAME = 256 * 1024 * 1024  # embeddings of large batches can be big; anything above is a bug

# every frame the router sends, and every frame a worker sends (corral.wire draws which answers which)
ToWorker = Union[GenerateRequest, EmbedRequest, TokenizeRequest, Abort, StatsRequest, Shutdown, SlotFileAction,
                 PersistCache, Preempt, Resume]
FromWorker = Union[
    Loading, Ready, LoadFailed, Delta, Finished, RequestFailed, Embeddings, Tokenized, Stats, SlotFileDone, Paused
]

_encoder = msgspec.msgpack.Encoder()
_to_worker = msgspec.msgpack.Decoder(ToWorker)
_from_worker = msgspec.msgpack.Decoder(FromWorker)


def encode(msg: ToWorker | FromWorker) -> bytes:
    """One framed message, ready for ``sock.sendall`` / ``writer.write``."""
    return frame(_encoder.encode(msg), MAX_FRAME)


def decode_to_worker(body: bytes | memoryview) -> ToWorker:
    return _to_worker.decode(body)


def decode_from_worker(body: bytes | memoryview) -> FromWorker:
    return _from_worker.decode(body)


class FrameDecoder(frames.FrameDecoder):
    """``corral.children.frames.FrameDecoder`` with this channel's largest frame."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        super().__init__(max_frame)
