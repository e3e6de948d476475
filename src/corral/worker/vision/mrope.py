"""M-RoPE images (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a slot's KV positions once an image is in it.

With a projector whose positions are M-RoPE (``mtmd_decode_use_mrope``) the text model takes
4 position values per embedding (llama_batch's ``pos`` holds ``n_tokens * 4``, section-major:
``pos[j * n_tokens + i]``): for an image token its temporal, row and column position
(``mtmd_helper_image_get_decoder_pos``: t = p0, y = p0 + row, x = p0 + column of the image's
nx-wide grid, as llama.cpp's mtmd-helper lays them out), and an image advances the positions of
what follows by its ``n_pos`` (``mtmd_input_chunk_get_n_pos``, max(nx, ny)), not by its token
count. So the KV position of a slot's n-th entry is no longer n after an image:

    kv_pos(tokens, n) = n - sum(image.n_tokens - image.n_pos for each image ending at or before n)

(llama-server's ``server_tokens::pos_next``). Text token batches keep one position a token
(llama.cpp spreads it over the sections). Where corral writes a position:

- prompt chunks (``prefill.py``) and a generating slot's pending token (``speculate.fill``):
  ``kv_pos`` of the slot's cached length under its job's tokens;
- an image's pieces (``worker/vision/steps.py``): ``write_positions`` from the image's first position,
  in the engine's steps and in the side context beside other streams alike;
- prefix reuse (``engine._start``): the KV is cut at ``kv_pos`` of the reused length (a reuse
  never ends inside an image: ``VisionTokens.snap``), which also trims what a prompt-cache
  restore (``prompt_cache._restore`` cuts at the entry's length) left beyond it;
- speculation: a draft's tokens at ``kv_pos`` of the slot's cached length on (``speculate.fill``),
  a rejected tail cut at ``kv_pos`` of the kept length (``speculate.settle``);

Everything else is unchanged: a host-RAM entry or a paused request's state restores its
cells with their positions (``llama_state_seq_*`` keeps them); context checks count cells
(prompt tokens), which M-RoPE does not change; a paused image request is never recomputed
(``preempt.py``) and slot files refuse image positions (``slot_files.py``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp.mtmd_cpp as mtmd

from corral.worker.vision.projector import ImageSpan, VisionTokens

__all__ = ["N_POS_PER_EMBD", "kv_pos", "write_positions"]

N_POS_PER_EMBD = 4  # llama.cpp's M-RoPE: positions per embedding (the 4th section unused by Qwen2-VL)


def kv_pos(tokens: Sequence[int], n: int) -> int:
    """The KV position of entry ``n`` of a sequence whose prompt is ``tokens`` (``n`` may run
    past the prompt into generated tokens): ``n`` less what the images before it skip."""
    if not isinstance(tokens, VisionTokens):
        return n
    return n - sum(s.n_tokens - s.n_pos for s in tokens.images if s.end <= n)


def write_positions(pos: ctypes.Array[ctypes.c_int32], span: ImageSpan, p0: int, off: int, k: int) -> None:
    """The 4 M-RoPE sections of image tokens ``off .. off + k - 1`` of ``span`` (whose first
    token is at KV position ``p0``) into a batch of ``k`` embeddings: ``pos[j * k + i]``,
    t, y, x, z as mtmd-helper's ``set_position_mrope_2d``."""
    image = mtmd.mtmd_input_chunk_get_tokens_image(span.chunk)
    if not image:
        raise RuntimeError("the image chunk has no image tokens")
    out = (mtmd.mtmd_decoder_pos * span.n_tokens)()
    mtmd.mtmd_helper_image_get_decoder_pos(image, p0, out)
    for i in range(k):
        d = out[off + i]
        pos[i], pos[k + i], pos[2 * k + i], pos[3 * k + i] = d.t, d.y, d.x, d.z
