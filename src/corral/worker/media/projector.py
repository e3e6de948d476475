"""Media through llama.cpp's multimodal library (libmtmd, ``llama_cpp.mtmd_cpp``): the
projector, a request's media as prompt positions, and one chunk's encode.

- ``load_projector(settings, m)``: the ``mmproj`` GGUF on the loaded text model (None
  without one). ``ModelLoadError`` for a file libmtmd refuses (not a projector, another
  model's width) or one with neither a vision nor an audio encoder. M-RoPE projectors (Qwen2-VL and kin:
  2-D image positions, ``Projector.mrope``) are placed by ``worker/media/mrope.py``.
- ``Projector.tokenize(text, media, ...)``: the rendered prompt, with one
  ``wire.MEDIA_MARKER`` per file, as a ``MediaPrompt`` (media/prompt.py): a plain
  ``list[int]`` of the prompt's positions (text tokens, and for every position of a chunk a
  negative pseudo-id derived from a hash of its content and the position in it, ``media_ids``),
  carrying each chunk (an ``ImageChunk`` or an ``AudioChunk``, one per encoder window of a
  recording: a kind of ``CHUNK_KINDS``). Everything that
  compares prompts (slot reuse, the host-RAM store) sees the same picture as the same ids
  and another picture as other ids.
- ``Projector.encode(chunk)``: runs the encoder on one chunk (any thread; one at a
  time) and returns its embeddings, ``n_tokens x n_embd`` floats.

The step's side (which slot's chunk is encoded when, the embeddings decoded in pieces
beside the other slots' tokens) is in ``worker/media/steps.py``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import threading
from dataclasses import dataclass, field

import llama_cpp as ll
import llama_cpp.mtmd_cpp as mtmd
import numpy as np
import numpy.typing as npt

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.host.devices import logged_buffers
from corral.worker.llama_context import captured, flash_attn_type
from corral.worker.llama_context import log_callback as _log_callback
from corral.worker.llama_context import log_lines as _log_lines
from corral.worker.media.audio import AudioChunk, window_digest
from corral.worker.media.image import ImageChunk
from corral.worker.media.prompt import MediaChunk, MediaPrompt, MtmdChunks
from corral.worker.model import LoadedModel, ModelLoadError

__all__ = ["CHUNK_KINDS", "Projector", "load_projector", "media_ids"]

# the media chunk kinds a prompt may hold, by libmtmd's chunk type (a new kind: its
# ``MediaChunk`` subclass in its own module of media/, and one line here)
CHUNK_KINDS: dict[int, type[MediaChunk]] = {
    mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE: ImageChunk,
    mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO: AudioChunk,
}
_ID_SPACE = 2**31 - 1  # pseudo-ids are -1 .. -(2**31 - 1): they fit the batch's int32 tokens
_USING = re.compile(r"CLIP using (\S+) backend")  # clip.cpp's line at the load
_FLASH = re.compile(r"flash attention is (enabled|disabled)")  # clip.cpp's warmup, at the load


def media_ids(digest: bytes, n: int) -> list[int]:
    """The pseudo-ids of a chunk's ``n`` positions: negative, from the content hash and the
    position (two pictures share no run of ids, a prefix of one image is not the whole)."""
    out = []
    for j in range(n):
        h = hashlib.blake2b(digest + j.to_bytes(4, "little"), digest_size=8).digest()
        out.append(-(1 + int.from_bytes(h, "little") % _ID_SPACE))
    return out


@dataclass(eq=False)
class Projector:
    ctx: mtmd.mtmd_context_p
    n_embd: int
    path: str
    nbytes: int
    mrope: bool = False  # 4 positions an embedding, images advance by n_pos (media/mrope.py)
    vision: bool = True  # it has an image encoder (mtmd_support_vision)
    audio: bool = False  # it has an audio encoder (mtmd_support_audio)
    device: str = ""  # the backend libmtmd runs it on, as it logged it ("Vulkan0", "CPU")
    flash_attn: bool = False  # its attention is flash attention, as libmtmd logged it at the load
    buffers: list[wire.BufferSize] = field(default_factory=list)  # its compute buffers, as logged
    encodes: int = 0  # images encoded (a cache hit is none)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tokenize(self, text: str, images: list[bytes], *, add_special: bool) -> MediaPrompt:
        """``text``'s tokens and its media's positions; RequestRejected for a file that
        does not decode, or markers and files that do not pair up. A file is an image, or a
        recording as the router sends one (16 kHz mono WAV): libmtmd tells them apart."""
        n_markers = text.count(wire.MEDIA_MARKER)
        if n_markers != len(images):
            raise RequestRejected("invalid_request", f"the prompt has {n_markers} media marker(s) but "
                                                     f"{len(images)} file(s) came with it")
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

    def _tokenize(self, text: str, bitmaps: list[tuple[mtmd.mtmd_bitmap_p, bytes]], add_special: bool) -> MediaPrompt:
        raw = text.encode("utf-8")
        inp = mtmd.mtmd_input_text(raw, len(raw), add_special, True)
        arr = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*[bm for bm, _ in bitmaps])
        chunks = MtmdChunks(mtmd.mtmd_input_chunks_init())
        rc = mtmd.mtmd_tokenize(self.ctx, chunks.ptr, ctypes.byref(inp), arr, len(bitmaps))
        if rc != 0:
            raise RequestRejected("invalid_request", "the images could not be prepared for the projector"
                                  if rc == 2 else "the image markers and the images do not pair up")
        out = MediaPrompt()
        found: list[MediaChunk] = []
        by_id = {d.hex(): d for _, d in bitmaps}  # each chunk names its bitmap (mtmd_bitmap_set_id)
        windows: dict[bytes, int] = {}  # a recording over one encoder window is several chunks
        for i in range(mtmd.mtmd_input_chunks_size(chunks.ptr)):
            chunk = mtmd.mtmd_input_chunks_get(chunks.ptr, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t(0)
                toks = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                out.extend(toks[: count.value] if count.value else [])
                continue
            cls = CHUNK_KINDS.get(kind)
            if cls is None:
                takes = " and ".join(sorted(c.kind for c in CHUNK_KINDS.values()))
                raise RequestRejected("invalid_request", f"this model takes {takes} only, not this kind of media")
            n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            digest = by_id[(mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode()]
            if cls is AudioChunk:
                k = windows[digest] = windows.get(digest, -1) + 1
                digest = window_digest(digest, k)
            found.append(cls(len(out), n, digest, chunk, chunks, bool(mtmd.mtmd_decode_use_non_causal(self.ctx, chunk)),
                             mtmd.mtmd_input_chunk_get_n_pos(chunk)))
            out.extend(media_ids(digest, n))
        out.chunks = tuple(found)
        if found and found[-1].end == len(out):
            raise RequestRejected("invalid_request", f"the prompt may not end with its {found[-1].kind}: "
                                                     "text must follow it")
        return out

    def encode(self, chunk: MediaChunk) -> npt.NDArray[np.float32]:
        """The chunk's embeddings (any thread; encodes run one at a time)."""
        with self._lock:
            rc = mtmd.mtmd_encode_chunk(self.ctx, chunk.chunk)
            if rc != 0:
                raise RuntimeError(f"the projector failed to encode the {chunk.kind} (mtmd_encode_chunk returned {rc})")
            ptr = mtmd.mtmd_get_output_embd(self.ctx)
            count = chunk.n_tokens * self.n_embd
            embd = np.ctypeslib.as_array(ptr, shape=(count,)).copy().reshape(chunk.n_tokens, self.n_embd)
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
    p.flash_attn_type = flash_attn_type(s)
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
                     flash_attn=[f.group(1) for f in map(_FLASH.search, lines) if f][-1:] == ["enabled"],
                     buffers=logged_buffers(lines))
