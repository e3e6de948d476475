"""What a prompt is, to the step: its positions, its KV positions, the spans a reused prefix may
not cut, and whether its KV can be recomputed from its ids.

A text prompt is a plain ``list[int]`` of tokens. A prompt that carries media (images now,
audio next) is a ``MediaPrompt``: a ``list[int]`` too (text tokens, and for each position
of a media chunk a negative pseudo-id from the chunk's content hash, so everything that
compares prompts, slot reuse and the host-RAM store, sees the same picture as the same ids),
carrying its ``MediaChunk`` s in order. The step asks a prompt these questions through the
functions below, which name no modality and answer a plain list's trivial answer:

    kv_pos(tokens, n)         the KV position of entry n (a chunk may advance fewer positions
                              than it has, M-RoPE's images: media/mrope.py)
    text_end(tokens, pos)     where the run of text tokens from pos ends (the next chunk's start)
    reuse_cut(tokens, n)      a reusable prefix of n entries cut back to whole chunks
    recomputable(tokens)      False: its KV holds embeddings, not tokens (a paused request
                              with media is never recomputed: preempt/preemption.py)
    has_media(tokens)         any chunk at all (the urgent starts' plain prefill: preempt/urgent.py)

A chunk kind (``ImageChunk``, media/image.py) is a ``MediaChunk`` subclass: its ``kind``
(the word the errors use) and its M-RoPE positions (``write_mrope``); the projector makes one
per libmtmd chunk of a registered type (``projector.CHUNK_KINDS``). The step's side of a
chunk (encode, decode of its embeddings in pieces, the side context) is the same for every
kind: media/steps.py.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import numpy.typing as npt

from corral import wire

__all__ = ["MediaChunk", "MediaPrompt", "MediaTokenizer", "MtmdChunks", "has_media", "kv_pos", "recomputable",
           "request_media", "reuse_cut", "text_end"]


class MtmdChunks:
    """An ``mtmd_input_chunks`` list, freed when the last reference goes."""

    def __init__(self, ptr: mtmd.mtmd_input_chunks_p) -> None:
        self.ptr = ptr
        weakref.finalize(self, mtmd.mtmd_input_chunks_free, ptr)


@dataclass(eq=False)
class MediaChunk:
    """One chunk of media in a prompt: positions ``start .. start + n_tokens - 1``, whose KV
    holds the projector's embeddings (``embd`` once encoded, until decoded)."""

    kind: ClassVar[str] = "media"  # what a user calls it ("image", "audio")

    start: int
    n_tokens: int
    digest: bytes  # blake2b of the decoded content (an image's width, height, RGB)
    chunk: mtmd.mtmd_input_chunk_p  # owned by ``owner``
    owner: MtmdChunks
    non_causal: bool  # its positions attend to one another (decoded in one piece: media/steps.py)
    n_pos: int  # KV positions it advances: n_tokens, or fewer with M-RoPE (media/mrope.py)
    embd: npt.NDArray[np.float32] | None = None  # after the encode: n_tokens x n_embd

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    def write_mrope(self, pos: ctypes.Array[ctypes.c_int32], p0: int, off: int, k: int) -> None:
        """The M-RoPE sections of positions ``off .. off + k - 1`` of this chunk (its first at
        KV position ``p0``) into a batch of ``k`` embeddings, section-major (media/mrope.py)."""
        raise NotImplementedError(f"{self.kind}: no M-RoPE positions")


class MediaPrompt(list[int]):
    """A prompt's positions (a list of ints like any prompt) with its media chunks, in order."""

    chunks: tuple[MediaChunk, ...] = ()

    def chunk_at(self, pos: int) -> MediaChunk | None:
        """The chunk whose positions include ``pos``, if any."""
        for c in self.chunks:
            if c.start <= pos < c.end:
                return c
        return None

    def text_end(self, pos: int) -> int:
        """Where the run of text tokens from ``pos`` ends: the next chunk's start (``pos``
        itself inside a chunk), else the prompt's end."""
        return next((max(pos, c.start) for c in self.chunks if c.end > pos), len(self))

    def reuse_cut(self, reuse: int) -> int:
        """A reusable prefix cut back to whole chunks: KV of part of a chunk is not reused
        (its positions may attend to one another, non-causally)."""
        c = self.chunk_at(reuse) if reuse > 0 else None
        return c.start if c is not None and c.start < reuse else reuse

    def kv_pos(self, n: int) -> int:
        """The KV position of entry ``n`` (which may run past the prompt into generated
        tokens): ``n`` less what the chunks before it skip (llama-server's ``pos_next``)."""
        return n - sum(c.n_tokens - c.n_pos for c in self.chunks if c.end <= n)


class MediaTokenizer(Protocol):
    """What prompts need of the engine's media (``media.steps.MediaSteps``, a floor above)."""

    def tokenize(self, text: str, media: list[bytes], *, add_special: bool) -> MediaPrompt: ...


def request_media(req: wire.GenerateRequest) -> list[bytes]:
    """The media files a request carries, in the order of its prompt's ``wire.MEDIA_MARKER`` s:
    its messages' (a chat), else its raw prompt's."""
    if req.messages is not None:
        return [f for m in req.messages for f in m.images or ()]
    return list(req.images or ())


def kv_pos(tokens: Sequence[int], n: int) -> int:
    """The KV position of entry ``n`` of a sequence whose prompt is ``tokens``."""
    return tokens.kv_pos(n) if isinstance(tokens, MediaPrompt) else n


def text_end(tokens: Sequence[int], pos: int) -> int:
    """Where the run of text tokens from ``pos`` ends (the prompt's end for a text prompt)."""
    return tokens.text_end(pos) if isinstance(tokens, MediaPrompt) else len(tokens)


def reuse_cut(tokens: Sequence[int], reuse: int) -> int:
    """``reuse`` reusable entries of ``tokens`` cut back to the start of a chunk they end inside."""
    return tokens.reuse_cut(reuse) if isinstance(tokens, MediaPrompt) else reuse


def has_media(tokens: Sequence[int]) -> bool:
    """Whether the prompt carries any media chunk."""
    return isinstance(tokens, MediaPrompt) and bool(tokens.chunks)


def recomputable(tokens: Sequence[int]) -> bool:
    """Whether the KV of the prompt's positions can be decoded again from ``tokens`` alone
    (not where a chunk's positions hold embeddings)."""
    return not has_media(tokens)
