"""A tiny Qwen2-VL pair made offline for the M-RoPE vision tests (and bench/checks/vision_mrope.py).

- ``write_qwen2vl_model``: a text model of llama.cpp's ``qwen2vl`` architecture (M-RoPE:
  ``rope.dimension_sections``), 2 layers, n_embd 64, biased q/k/v as Qwen2's, and a small
  SentencePiece vocabulary llama.cpp accepts (the control tokens ``<|vision_start|>`` and
  ``<|vision_end|>`` that libmtmd puts around an image, byte fallback for any other text,
  a few hundred words and letters).
- ``write_qwen2vl_mmproj``: a projector clip.cpp loads as ``qwen2vl_merger`` (or, with
  ``version="2.5"``, ``qwen2.5vl_merger``): the two patch convolutions, ``n_layer`` blocks with 2-D M-RoPE attention, a post-norm and the 2x2 merger
  MLP onto the text model's width. Dynamic resolution: a W x H picture (resized to
  multiples of ``patch_size * 2``) is ``(W / p / 2) x (H / p / 2)`` image tokens, laid out
  nx wide; its text positions advance by max(nx, ny) (``n_pos``), not by its token count.

Random weights from a fixed seed: the words mean nothing, every step is real. Needs only the
PyPI ``gguf`` package and numpy, no network.
"""

from __future__ import annotations

from pathlib import Path

from .gguf_vision import RandomTensors

__all__ = ["QWEN_WORDS", "image_grid", "write_qwen2vl_mmproj", "write_qwen2vl_model"]

QWEN_WORDS = ("the a of to in is and picture image caption what this shows cat dog red green blue sky "
              "sea tree house car road sun moon light dark big small left right top bottom one two three "
              "color shape line square circle face hand book water fire city river hello world").split()
PATCH = 4  # the projector's patch size (tests: 64 x 48 px -> 8 x 6 image tokens)


def image_grid(width: int, height: int, *, patch_size: int = PATCH) -> tuple[int, int]:
    """(nx, ny) of a picture whose sides are multiples of ``patch_size * 2`` (no resize)."""
    return width // patch_size // 2, height // patch_size // 2


def write_qwen2vl_model(dst: Path, *, n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                        n_ff: int = 128, n_ctx_train: int = 4096, seed: int = 2024, arch: str = "qwen2vl") -> Path:
    """A ``qwen2vl`` text model with M-RoPE sections [2, 3, 3, 0] (head 16, n_rot 16); ``arch``
    "qwen3vl": Qwen3-VL's (q/k norms, no biases, one deepstack layer: its input embeddings are
    2 x n_embd wide, the image features of one vision layer added after its first layer)."""
    v3 = arch == "qwen3vl"
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    head = n_embd // n_head
    controls = ["<s>", "</s>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>", "<|im_end|>"]
    tokens = ["<unk>", *controls] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2] + [3] * len(controls) + [6] * 256  # unknown, control, byte
    scores = [0.0] * len(tokens)
    pieces = ["\u2581" + w for w in QWEN_WORDS] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["\u2581", *".,:?!'-\n"] + [str(d) for d in range(10)]
    for i, p in enumerate(dict.fromkeys(pieces)):
        tokens.append(p)
        types.append(1)
        scores.append(-1.0 - i * 0.01 if p.startswith("\u2581") and len(p) > 1 else -10.0 - i * 0.01)
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(dst), arch=arch)
    w.add_name(f"corral-test-{arch}")
    if v3:
        w.add_uint32(f"{arch}.n_deepstack_layers", 1)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_sections([2, 3, 3, 0])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)

    r = RandomTensors(w, rng)
    t, ones = r.t, r.ones

    t("token_embd.weight", n_embd, n_vocab, scale=0.5)
    ones("output_norm.weight", n_embd)
    t("output.weight", n_embd, n_vocab, scale=0.3)
    kv = head * n_head_kv
    for i in range(n_layer):
        p = f"blk.{i}"
        ones(f"{p}.attn_norm.weight", n_embd)
        t(f"{p}.attn_q.weight", n_embd, n_embd, scale=0.3)
        t(f"{p}.attn_k.weight", n_embd, kv, scale=0.3)
        t(f"{p}.attn_v.weight", n_embd, kv, scale=0.3)
        if v3:
            ones(f"{p}.attn_q_norm.weight", head)
            ones(f"{p}.attn_k_norm.weight", head)
        else:
            t(f"{p}.attn_q.bias", n_embd, scale=0.1)
            t(f"{p}.attn_k.bias", kv, scale=0.1)
            t(f"{p}.attn_v.bias", kv, scale=0.1)
        t(f"{p}.attn_output.weight", n_embd, n_embd, scale=0.2)
        ones(f"{p}.ffn_norm.weight", n_embd)
        t(f"{p}.ffn_gate.weight", n_embd, n_ff, scale=0.2)
        t(f"{p}.ffn_up.weight", n_embd, n_ff, scale=0.2)
        t(f"{p}.ffn_down.weight", n_ff, n_embd, scale=0.2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def write_qwen2vl_mmproj(dst: Path, *, text_n_embd: int = 64, patch_size: int = PATCH, n_embd: int = 32,
                         n_ff: int = 48, n_layer: int = 2, n_head: int = 2, seed: int = 4242,
                         version: str = "2") -> Path:
    """A ``qwen2vl_merger`` projector for a text model of width ``text_n_embd``; ``version``
    "2.5": a ``qwen2.5vl_merger`` (RMS norms, a gated FFN, windowed attention in every block
    but the last: windows of 4 x 4 image tokens)."""
    import gguf
    import numpy as np

    if n_ff == n_embd:
        raise ValueError("n_ff must differ from n_embd (clip.cpp would swap up and down)")
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(dst), arch="clip")
    w.add_name("corral-test-qwen2vl-mmproj")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    v25, v3 = version == "2.5", version == "3"
    w.add_string("clip.projector_type", {"2.5": "qwen2.5vl_merger", "3": "qwen3vl_merger"}.get(version, "qwen2vl_merger"))
    w.add_bool("clip.use_silu" if v25 else "clip.use_gelu", True)
    if v25:
        w.add_uint32("clip.vision.n_wa_pattern", n_layer)
        w.add_uint32("clip.vision.window_size", patch_size * 2 * 4)
    w.add_uint32("clip.vision.image_size", 64)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", n_layer)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", text_n_embd)
    w.add_uint32("clip.vision.spatial_merge_size", 2)
    w.add_array("clip.vision.image_mean", [0.48, 0.46, 0.41])
    w.add_array("clip.vision.image_std", [0.27, 0.26, 0.28])

    r = RandomTensors(w, rng)
    t, ones = r.t, r.ones

    t("v.patch_embd.weight", patch_size, patch_size, 3, n_embd, scale=0.2)
    t("v.patch_embd.weight.1", patch_size, patch_size, 3, n_embd, scale=0.2)
    if v3:
        t("v.patch_embd.bias", n_embd, scale=0.02)
        t("v.position_embd.weight", n_embd, (64 // patch_size) ** 2, scale=0.2)
    for i in range(n_layer):
        p = f"v.blk.{i}"
        if v3:  # one fused q/k/v; block 0's output also feeds a deepstack merger
            t(f"{p}.attn_qkv.weight", n_embd, 3 * n_embd)
            t(f"{p}.attn_qkv.bias", 3 * n_embd, scale=0.02)
        if v3 and i == 0:
            ones(f"v.deepstack.{i}.norm.weight", n_embd * 4)
            t(f"v.deepstack.{i}.norm.bias", n_embd * 4, scale=0.02)
            t(f"v.deepstack.{i}.fc1.weight", n_embd * 4, n_embd * 4, scale=0.1)
            t(f"v.deepstack.{i}.fc1.bias", n_embd * 4, scale=0.02)
            t(f"v.deepstack.{i}.fc2.weight", n_embd * 4, text_n_embd, scale=0.2)
            t(f"v.deepstack.{i}.fc2.bias", text_n_embd, scale=0.02)
        r.vit_block(p, n_embd, n_ff, separate_qkv=not v3)
        if v25:
            t(f"{p}.ffn_gate.weight", n_embd, n_ff)
            t(f"{p}.ffn_gate.bias", n_ff, scale=0.02)
    ones("v.post_ln.weight", n_embd)
    t("v.post_ln.bias", n_embd, scale=0.02)
    t("mm.0.weight", n_embd * 4, n_embd * 4, scale=0.1)
    t("mm.0.bias", n_embd * 4, scale=0.02)
    t("mm.2.weight", n_embd * 4, text_n_embd, scale=0.2)
    t("mm.2.bias", text_n_embd, scale=0.02)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
