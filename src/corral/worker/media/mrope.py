"""M-RoPE images (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a slot's KV positions once an image is in it.

With a projector whose positions are M-RoPE (``mtmd_decode_use_mrope``) the text model takes
4 position values per embedding (llama_batch's ``pos`` holds ``n_tokens * 4``, section-major:
``pos[j * n_tokens + i]``): for an image token its temporal, row and column position
(``mtmd_helper_image_get_decoder_pos``: t = p0, y = p0 + row, x = p0 + column of the image's
nx-wide grid, as llama.cpp's mtmd-helper lays them out), and an image advances the positions of
what follows by its ``n_pos`` (``mtmd_input_chunk_get_n_pos``, max(nx, ny)), not by its token
count. So the KV position of a slot's n-th entry is no longer n after an image:

    kv_pos(tokens, n) = n - sum(image.n_tokens - image.n_pos for each image ending at or before n)

(llama-server's ``server_tokens::pos_next``: ``MediaPrompt.kv_pos``, media/prompt.py, asked as
``media.prompt.kv_pos`` by every place that writes or cuts a position: prefill.py, speculation,
the prompt cache, ``slots.keep_prefix``). Text token batches keep one position a token
(llama.cpp spreads it over the sections). An image's pieces (media/steps.py) take the 4
sections from ``ImageChunk.write_mrope`` (media/image.py: ``write_image_positions`` here),
from the image's first position, in the engine's steps and in the side context alike. A reuse
never ends inside an image (``reuse_cut``), so a cut at ``kv_pos`` of a reused length is a cut
between whole chunks.

Everything else is unchanged: a host-RAM entry or a paused request's state restores its
cells with their positions (``llama_state_seq_*`` keeps them); context checks count cells
(prompt tokens), which M-RoPE does not change; a paused request with media is never
recomputed (``media.prompt.recomputable``) and slot files refuse media positions (negative
ids: ``worker/cache/slot_files.py``).
"""

from __future__ import annotations

import ctypes

import llama_cpp.mtmd_cpp as mtmd

__all__ = ["N_POS_PER_EMBD", "write_image_positions"]

N_POS_PER_EMBD = 4  # llama.cpp's M-RoPE: positions per embedding (the 4th section unused by Qwen2-VL)


def write_image_positions(pos: ctypes.Array[ctypes.c_int32], chunk: mtmd.mtmd_input_chunk_p, n_tokens: int, p0: int,
                          off: int, k: int) -> None:
    """The 4 M-RoPE sections of image tokens ``off .. off + k - 1`` of an image chunk of
    ``n_tokens`` (whose first token is at KV position ``p0``) into a batch of ``k``
    embeddings: ``pos[j * k + i]``, t, y, x, z as mtmd-helper's ``set_position_mrope_2d``."""
    image = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
    if not image:
        raise RuntimeError("the image chunk has no image tokens")
    out = (mtmd.mtmd_decoder_pos * n_tokens)()
    mtmd.mtmd_helper_image_get_decoder_pos(image, p0, out)
    for i in range(k):
        d = out[off + i]
        pos[i], pos[k + i], pos[2 * k + i], pos[3 * k + i] = d.t, d.y, d.x, d.z
