"""Images as a media chunk kind (``ImageChunk``, registered in ``projector.CHUNK_KINDS``):
everything else an image needs is the same for every chunk (media/prompt.py, media/steps.py)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import ClassVar

from corral.worker.media.mrope import write_image_positions
from corral.worker.media.prompt import MediaChunk

__all__ = ["ImageChunk"]


@dataclass(eq=False)
class ImageChunk(MediaChunk):
    """One image of a prompt (libmtmd's ``MTMD_INPUT_CHUNK_TYPE_IMAGE``)."""

    kind: ClassVar[str] = "image"

    def write_mrope(self, pos: ctypes.Array[ctypes.c_int32], p0: int, off: int, k: int) -> None:
        """Its 2-D positions: t, row, column of the image's grid (media/mrope.py)."""
        write_image_positions(pos, self.chunk, self.n_tokens, p0, off, k)
