"""Images through llama.cpp's multimodal library (libmtmd, ``llama_cpp.mtmd_cpp``): the
projector, a request's images as prompt positions, and one image's encode.

- ``load_projector(settings, m)``: the ``mmproj`` GGUF on the loaded text model (None
  without one). ``ModelLoadError`` for a file libmtmd refuses (not a projector, another
  model's width) or one without a vision encoder. M-RoPE projectors (Qwen2-VL and kin:
  2-D image positions, ``Projector.mrope``) are placed by ``worker/vision/mrope.py``.
- ``Projector.tokenize(text, images, ...)``: the rendered prompt, with one
  ``wire.MEDIA_MARKER`` per image, as ``VisionTokens``: a plain ``list[int]`` of the
  prompt's positions (text tokens, and for every image position a negative pseudo-id
  derived from a hash of the image's pixels and the position in the image), carrying the
  ``ImageSpan`` of each image. Everything that compares prompts (slot reuse, the host-RAM
  store) sees the same picture as the same ids and another picture as other ids.
- ``Projector.encode(span)``: runs the vision tower on one image (any thread; one at a
  time) and returns its embeddings, ``n_tokens x n_embd`` floats.

The step's side (which slot's image is encoded when, the embeddings decoded in pieces
beside the other slots' tokens) is in ``worker/vision/steps.py``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import threading
import weakref
from dataclasses import dataclass, field

import llama_cpp as ll
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import numpy.typing as npt

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.host.devices import logged_buffers
from corral.worker.llama_context import captured
from corral.worker.llama_context import log_callback as _log_callback
from corral.worker.llama_context import log_lines as _log_lines
from corral.worker.model import LoadedModel, ModelLoadError

__all__ = ["ImageSpan", "Projector", "VisionTokens", "image_ids", "load_projector"]

_CHUNK_IMAGE, _CHUNK_AUDIO = 1, 2  # MTMD_INPUT_CHUNK_TYPE_* (0 text)
_ID_SPACE = 2**31 - 1  # pseudo-ids are -1 .. -(2**31 - 1): they fit the batch's int32 tokens
_USING = re.compile(r"CLIP using (\S+) backend")  # clip.cpp's line at the load


def image_ids(digest: bytes, n: int) -> list[int]:
    """The pseudo-ids of an image's ``n`` positions: negative, from the pixel hash and the
    position (two pictures share no run of ids, a prefix of one image is not the whole)."""
    out = []
    for j in range(n):
        h = hashlib.blake2b(digest + j.to_bytes(4, "little"), digest_size=8).digest()
        out.append(-(1 + int.from_bytes(h, "little") % _ID_SPACE))
    return out


@dataclass(eq=False)
class ImageSpan:
    """One image of a prompt: positions ``start .. start + n_tokens - 1``."""

    start: int
    n_tokens: int
    digest: bytes  # blake2b of the decoded pixels (width, height, RGB)
    chunk: mtmd.mtmd_input_chunk_p  # owned by ``owner``
    owner: _Chunks
    non_causal: bool
    n_pos: int  # KV positions it advances: n_tokens, or max(nx, ny) for M-RoPE (vision/mrope.py)
    embd: npt.NDArray[np.float32] | None = None  # after the encode: n_tokens x n_embd

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


class _Chunks:
    """An ``mtmd_input_chunks`` list, freed when the last reference goes."""

    def __init__(self, ptr: mtmd.mtmd_input_chunks_p) -> None:
        self.ptr = ptr
        weakref.finalize(self, mtmd.mtmd_input_chunks_free, ptr)


class VisionTokens(list[int]):
    """A prompt's positions (a list of ints like any prompt) with its images."""

    images: tuple[ImageSpan, ...] = ()

    def span_at(self, pos: int) -> ImageSpan | None:
        """The image whose positions include ``pos``, if any."""
        for s in self.images:
            if s.start <= pos < s.end:
                return s
        return None

    def text_end(self, pos: int) -> int:
        """Where the run of text tokens from ``pos`` ends: the next image's start (``pos``
        itself inside an image), else the prompt's end."""
        return next((max(pos, s.start) for s in self.images if s.end > pos), len(self))

    def snap(self, reuse: int) -> int:
        """A reusable prefix cut back to whole images: KV of part of an image is not reused
        (its positions attend to one another, non-causally)."""
        span = self.span_at(reuse) if reuse > 0 else None
        return span.start if span is not None and span.start < reuse else reuse


@dataclass(eq=False)
class Projector:
    ctx: mtmd.mtmd_context_p
    n_embd: int
    path: str
    nbytes: int
    mrope: bool = False  # 4 positions an embedding, images advance by n_pos (vision/mrope.py)
    vision: bool = True  # it has an image encoder (mtmd_support_vision)
    audio: bool = False  # it has an audio encoder (mtmd_support_audio): recordings are spans too
    device: str = ""  # the backend libmtmd runs it on, as it logged it ("Vulkan0", "CPU")
    buffers: list[wire.BufferSize] = field(default_factory=list)  # its compute buffers, as logged
    encodes: int = 0  # images encoded (a cache hit is none)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tokenize(self, text: str, images: list[bytes], *, add_special: bool) -> VisionTokens:
        """``text``'s tokens and its images' positions; RequestRejected for an image that
        does not decode, or markers and images that do not pair up."""
        n_markers = text.count(wire.MEDIA_MARKER)
        if n_markers != len(images):
            raise RequestRejected("invalid_request", f"the prompt has {n_markers} image marker(s) but "
                                                     f"{len(images)} image(s) came with it")
        bitmaps = [self._bitmap(i, data) for i, data in enumerate(images)]
        try:
            return self._tokenize(text, bitmaps, add_special)
        finally:
            for bm, _ in bitmaps:
                mtmd.mtmd_bitmap_free(bm)

    def _bitmap(self, i: int, data: bytes) -> tuple[mtmd.mtmd_bitmap_p, bytes]:
        if not data:
            raise RequestRejected("invalid_request", f"image {i + 1} is empty")
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bm = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
        if not bm:
            raise RequestRejected("invalid_request", f"image {i + 1} could not be decoded: not an image in a "
                                                     "format this server reads (PNG, JPEG, GIF, BMP, ...) "
                                                     "or a truncated one")
        nx, ny = mtmd.mtmd_bitmap_get_nx(bm), mtmd.mtmd_bitmap_get_ny(bm)
        n = mtmd.mtmd_bitmap_get_n_bytes(bm)
        pixels = ctypes.string_at(mtmd.mtmd_bitmap_get_data(bm), n)
        digest = hashlib.blake2b(nx.to_bytes(4, "little") + ny.to_bytes(4, "little") + pixels,
                                 digest_size=16).digest()
        mtmd.mtmd_bitmap_set_id(bm, digest.hex().encode())
        return bm, digest

    def _tokenize(self, text: str, bitmaps: list[tuple[mtmd.mtmd_bitmap_p, bytes]], add_special: bool) -> VisionTokens:
        raw = text.encode("utf-8")
        inp = mtmd.mtmd_input_text(raw, len(raw), add_special, True)
        arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*[bm for bm, _ in bitmaps])
        chunks = _Chunks(mtmd.mtmd_input_chunks_init())
        rc = mtmd.mtmd_tokenize(self.ctx, chunks.ptr, ctypes.byref(inp), arr, len(bitmaps))
        if rc != 0:
            raise RequestRejected("invalid_request", "the images could not be prepared for the projector"
                                  if rc == 2 else "the image markers and the images do not pair up")
        out = VisionTokens()
        spans: list[ImageSpan] = []
        by_id = {d.hex(): d for _, d in bitmaps}
        parts: dict[bytes, int] = {}  # a recording over 30 s is several audio chunks of one bitmap
        for i in range(mtmd.mtmd_input_chunks_size(chunks.ptr)):
            chunk = mtmd.mtmd_input_chunks_get(chunks.ptr, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind in (_CHUNK_IMAGE, _CHUNK_AUDIO):
                n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
                digest = by_id[(mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()]
                k = parts[digest] = parts.get(digest, -1) + 1 if kind == _CHUNK_AUDIO else 0
                if k:  # the k-th window of a recording: ids of its own
                    digest = hashlib.blake2b(digest + k.to_bytes(4, "little"), digest_size=16).digest()
                spans.append(ImageSpan(len(out), n, digest, chunk, chunks,
                                       bool(mtmd.mtmd_decode_use_non_causal(self.ctx, chunk)),
                                       mtmd.mtmd_input_chunk_get_n_pos(chunk)))
                out.extend(image_ids(digest, n))
            elif kind == 0:
                count = ctypes.c_size_t(0)
                toks = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                out.extend(toks[: count.value] if count.value else [])
            else:
                raise RequestRejected("invalid_request", f"the projector gave a chunk of unknown type {kind}")
        out.images = tuple(spans)
        if spans and spans[-1].end == len(out):
            raise RequestRejected("invalid_request", "the prompt may not end with an image")
        return out

    def encode(self, span: ImageSpan) -> npt.NDArray[np.float32]:
        """The image's embeddings (any thread; encodes run one at a time)."""
        with self._lock:
            rc = mtmd.mtmd_encode_chunk(self.ctx, span.chunk)
            if rc != 0:
                raise RuntimeError(f"the projector failed to encode the image (mtmd_encode_chunk returned {rc})")
            ptr = mtmd.mtmd_get_output_embd(self.ctx)
            count = span.n_tokens * self.n_embd
            embd = np.ctypeslib.as_array(ptr, shape=(count,)).copy().reshape(span.n_tokens, self.n_embd)
            self.encodes += 1
        return embd

    def free(self) -> None:
        with self._lock:
            if self.ctx:
                mtmd.mtmd_free(self.ctx)
                self.ctx = mtmd.mtmd_context_p(0)


def load_projector(s: wire.WorkerSettings, m: LoadedModel) -> Projector | None:
    """The settings' projector on the loaded model; None without one. On failure the
    model is freed and ``ModelLoadError`` says why."""
    if not s.mmproj or m.embedding:
        return None
    try:
        return _load(s, s.mmproj, m)
    except BaseException:
        m.free()
        raise


def _load(s: wire.WorkerSettings, path: str, m: LoadedModel) -> Projector:
    if not os.path.isfile(path):
        raise ModelLoadError(f"mmproj: no such file: {path}")
    mtmd.mtmd_helper_log_set(_log_callback, ctypes.c_void_p(0))
    _log_lines.clear()
    p = mtmd.mtmd_context_params_default()
    p.use_gpu = m.info.gpu_layers > 0
    p.n_threads = m.threads_batch
    p.print_timings = False
    p.media_marker = wire.MEDIA_MARKER.encode()
    with captured() as lines:  # "CLIP using Vulkan0 backend", "Vulkan0 compute buffer size = ..."
        ctx = mtmd.mtmd_init_from_file(path.encode(), m.model, p)
    if not ctx:
        detail = "; ".join(line for line in _log_lines if line)[-500:]
        raise ModelLoadError(f"mmproj: libmtmd could not load {path} for this model" + (f": {detail}" if detail else ""))
    vision, audio = bool(mtmd.mtmd_support_vision(ctx)), bool(mtmd.mtmd_support_audio(ctx))
    if not vision and not audio:
        mtmd.mtmd_free(ctx)
        raise ModelLoadError(f"mmproj: {path} has neither a vision nor an audio encoder")
    used = [u.group(1) for u in map(_USING.search, lines) if u]
    return Projector(ctx, ll.llama_model_n_embd_inp(m.model), path, os.path.getsize(path),  # n_embd_inp: Qwen3-VL adds deepstack
                     mrope=bool(mtmd.mtmd_decode_use_mrope(ctx)), vision=vision, audio=audio,
                     device=used[-1] if used else "",
                     buffers=logged_buffers(lines))
