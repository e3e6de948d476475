"""Audio as a media chunk kind (``AudioChunk``, registered in ``projector.CHUNK_KINDS``).

A recording reaches the worker as a 16 kHz mono WAV (the router decoded the client's file:
api/core/audio.py); libmtmd's decoder reads it into a bitmap of samples and ``mtmd_tokenize``
cuts it into chunks of one encoder window each (30 s for Whisper-style encoders: every
started window is the same number of positions, 750 for Qwen2-Audio). Each window is a
chunk of its own with ids of its own (``window_digest``): the same recording gives the same
ids, so a conversation that sends it again reuses its KV like an image's. Everything else
(encode, the decode in pieces, the side context beside other streams, the prompt cache,
preemption) is the same for every chunk (media/prompt.py, media/steps.py). Audio positions
are 1-D: an audio chunk advances ``n_tokens`` KV positions, and with an M-RoPE projector
(Qwen2.5-Omni) each of the 4 sections of an audio position is that position, as
mtmd-helper's ``set_position_mrope_1d`` writes them.
"""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass
from typing import ClassVar

from corral.worker.media.prompt import MediaChunk

__all__ = ["AudioChunk", "window_digest"]


@dataclass(eq=False)
class AudioChunk(MediaChunk):
    """One encoder window of a recording (libmtmd's ``MTMD_INPUT_CHUNK_TYPE_AUDIO``)."""

    kind: ClassVar[str] = "audio"

    def write_mrope(self, pos: ctypes.Array[ctypes.c_int32], p0: int, off: int, k: int) -> None:
        """Positions ``off .. off + k - 1`` of this chunk (its first at KV position ``p0``):
        the same 1-D position in each of the 4 sections."""
        for i in range(k):
            pos[i] = pos[k + i] = pos[2 * k + i] = pos[3 * k + i] = p0 + off + i


def window_digest(digest: bytes, k: int) -> bytes:
    """The content hash of window ``k`` of a recording whose samples hash to ``digest``
    (window 0 keeps the recording's own)."""
    return digest if k == 0 else hashlib.blake2b(digest + k.to_bytes(4, "little"), digest_size=16).digest()
