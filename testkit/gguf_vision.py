"""A Gemma 3 multimodal projector made offline for the vision tests (and bench/checks/vision.py).

``write_gemma3_mmproj`` writes a GGUF that llama.cpp's clip.cpp loads as projector type
``gemma3``: a SigLIP vision tower (patch embedding, learned positions, ``n_layer``
pre-norm blocks with biased attention and a GELU FFN, a post-norm), then Gemma 3's
average pool (``n_merge`` x ``n_merge`` patches per image token), the soft-embedding
RMS norm and the input projection to the text model's ``n_embd`` (640 for the embedded
Gemma 3 270M). Random weights from a fixed seed: the words a model says about a picture
are meaningless, but every step (preprocess, encode, decode the embeddings) is real.

An image becomes ``(image_size / patch_size / n_merge) ** 2`` tokens between
``<start_of_image>`` and ``<end_of_image>``. The FFN width differs from the hidden width
on purpose: clip.cpp swaps a gemma3 projector's up and down matrices when
``ffn_down`` has ``n_embd`` columns, the layout of old conversions.

Needs only the PyPI ``gguf`` package and numpy, no network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["RandomTensors", "image_tokens", "write_gemma3_mmproj"]


class RandomTensors:
    """f32 tensors of random weights from one generator, added to a ``gguf.GGUFWriter``;
    shapes in ggml's ne order (the reverse of numpy's)."""

    def __init__(self, writer: Any, rng: Any) -> None:
        self.w, self.rng = writer, rng

    def t(self, name: str, *ne: int, scale: float = 0.1) -> None:
        import numpy as np

        self.w.add_tensor(name, (self.rng.standard_normal(ne[::-1]) * scale).astype(np.float32))

    def ones(self, name: str, n: int) -> None:
        import numpy as np

        self.w.add_tensor(name, (1.0 + 0.05 * self.rng.standard_normal(n)).astype(np.float32))

    def vit_block(self, p: str, n_embd: int, n_ff: int, *, separate_qkv: bool = True) -> None:
        """One vision-tower block as clip.cpp names it (``p``: ``v.blk.N``): q/k/v (unless the
        caller wrote them fused), attention output, the two layer norms, up and down."""
        for part in ("q", "k", "v") if separate_qkv else ():
            self.t(f"{p}.attn_{part}.weight", n_embd, n_embd)
            self.t(f"{p}.attn_{part}.bias", n_embd, scale=0.02)
        self.t(f"{p}.attn_out.weight", n_embd, n_embd)
        self.t(f"{p}.attn_out.bias", n_embd, scale=0.02)
        self.ones(f"{p}.ln1.weight", n_embd)
        self.t(f"{p}.ln1.bias", n_embd, scale=0.02)
        self.ones(f"{p}.ln2.weight", n_embd)
        self.t(f"{p}.ln2.bias", n_embd, scale=0.02)
        self.t(f"{p}.ffn_up.weight", n_embd, n_ff)
        self.t(f"{p}.ffn_up.bias", n_ff, scale=0.02)
        self.t(f"{p}.ffn_down.weight", n_ff, n_embd)
        self.t(f"{p}.ffn_down.bias", n_embd, scale=0.02)


def image_tokens(*, image_size: int = 64, patch_size: int = 8, n_merge: int = 2) -> int:
    """How many embedding positions one image takes with a projector of these shapes."""
    side = image_size // patch_size // n_merge
    return side * side


def write_gemma3_mmproj(dst: Path, *, text_n_embd: int = 640, image_size: int = 64, patch_size: int = 8,
                        n_merge: int = 2, n_embd: int = 64, n_ff: int = 96, n_layer: int = 2, n_head: int = 4,
                        seed: int = 4321) -> Path:
    """A gemma3 projector for a text model of width ``text_n_embd``, written to ``dst``."""
    import gguf
    import numpy as np

    if image_size % (patch_size * n_merge):
        raise ValueError("image_size must be a multiple of patch_size * n_merge")
    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd (clip.cpp would swap up and down)")
    rng = np.random.default_rng(seed)
    n_patches = (image_size // patch_size) ** 2

    w = gguf.GGUFWriter(str(dst), arch="clip")
    w.add_name("corral-test-gemma3-mmproj")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_layer)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", text_n_embd)
    w.add_uint32("clip.vision.projector.scale_factor", n_merge)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    r = RandomTensors(w, rng)
    t, ones = r.t, r.ones

    t("v.patch_embd.weight", patch_size, patch_size, 3, n_embd, scale=0.2)
    t("v.patch_embd.bias", n_embd, scale=0.02)
    t("v.position_embd.weight", n_embd, n_patches, scale=0.2)
    for i in range(n_layer):
        r.vit_block(f"v.blk.{i}", n_embd, n_ff)
    ones("v.post_ln.weight", n_embd)
    t("v.post_ln.bias", n_embd, scale=0.02)
    ones("mm.soft_emb_norm.weight", n_embd)
    t("mm.input_projection.weight", text_n_embd, n_embd, scale=0.05)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
