"""A Qwen2-Audio projector made offline for the audio tests (and bench/scenarios/audio.py).

``write_qwen2a_mmproj`` writes a GGUF that llama.cpp's clip.cpp loads as projector type
``qwen2a`` (``load_hparams``, ``load_tensors``; graph ``tools/mtmd/models/whisper-enc.cpp``):
a Whisper encoder (two 1-D convolutions over the log-mel frames, the second of stride 2,
learned positions, ``n_layer`` pre-norm blocks whose key projection has no bias, a GELU
FFN), Qwen2-Audio's average pool of 2, a post-norm, and one linear projection (``mm.a.fc``)
to the text model's ``n_embd`` (640 for the embedded Gemma 3 270M). Random weights from a
fixed seed: the words a model says about a recording are meaningless, but every step
(resample, log-mel, encode, decode the embeddings) is real.

libmtmd pads every started 30-second window of 16 kHz audio to 3,000 mel frames (a window
holds 30 s less 10 ms: ``audio_tokens``); the convolutions halve them (1,500 positions)
and the pool halves them again: each window is ``WINDOW_TOKENS`` (750) prompt positions,
whatever the weights, between ``<|audio_bos|>``
and ``<|audio_eos|>`` (plain text to Gemma's tokenizer).

Needs only the PyPI ``gguf`` package and numpy, no network.
"""

from __future__ import annotations

from pathlib import Path

from .gguf_vision import RandomTensors

__all__ = ["WINDOW_S", "WINDOW_TOKENS", "audio_tokens", "write_qwen2a_mmproj"]

WINDOW_S = 30  # clip.cpp's audio_chunk_len for Whisper-style encoders
WINDOW_TOKENS = 750  # 3,000 mel frames / 2 (conv stride) / 2 (average pool)


def audio_tokens(seconds: float) -> int:
    """How many prompt positions ``seconds`` of 16 kHz audio take with this projector: libmtmd's
    mel (tools/mtmd/mtmd-audio.cpp) pads the recording with 30 s of silence and 200 samples at
    each end, takes ``(n + 480,000) // 160 + 1`` frames and encodes every whole 3,000: a
    window holds 30 s less 161 samples, and 30.0 s are two windows."""
    n = int(round(seconds * 16000))
    return WINDOW_TOKENS * (((n + 480_000) // 160 + 1) // 3000)


def write_qwen2a_mmproj(dst: Path, *, text_n_embd: int = 640, n_embd: int = 64, n_ff: int = 96,
                        n_layer: int = 2, n_head: int = 4, n_mel: int = 128, seed: int = 2468) -> Path:
    """A qwen2a projector for a text model of width ``text_n_embd``, written to ``dst``."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    n_pos = 1500  # positions after the convolutions of one 30-second window

    w = gguf.GGUFWriter(str(dst), arch="clip")
    w.add_name("corral-test-qwen2a-mmproj")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_string("clip.projector_type", "qwen2a")
    w.add_uint32("clip.audio.embedding_length", n_embd)
    w.add_uint32("clip.audio.feed_forward_length", n_ff)
    w.add_uint32("clip.audio.block_count", n_layer)
    w.add_uint32("clip.audio.attention.head_count", n_head)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("clip.audio.projection_dim", text_n_embd)
    w.add_uint32("clip.audio.num_mel_bins", n_mel)

    r = RandomTensors(w, rng)
    t, ones = r.t, r.ones
    # convolutions: kernel 3, numpy (out, in, k); biases (out, 1) as the HF conversion writes them
    t("a.conv1d.1.weight", 3, n_mel, n_embd, scale=0.05)
    t("a.conv1d.1.bias", 1, n_embd, scale=0.02)
    t("a.conv1d.2.weight", 3, n_embd, n_embd, scale=0.05)
    t("a.conv1d.2.bias", 1, n_embd, scale=0.02)
    t("a.position_embd.weight", n_embd, n_pos, scale=0.2)
    for i in range(n_layer):
        p = f"a.blk.{i}"
        for part in ("q", "k", "v"):
            t(f"{p}.attn_{part}.weight", n_embd, n_embd)
        t(f"{p}.attn_q.bias", n_embd, scale=0.02)  # Whisper's key projection has no bias
        t(f"{p}.attn_v.bias", n_embd, scale=0.02)
        t(f"{p}.attn_out.weight", n_embd, n_embd)
        t(f"{p}.attn_out.bias", n_embd, scale=0.02)
        ones(f"{p}.ln1.weight", n_embd)
        t(f"{p}.ln1.bias", n_embd, scale=0.02)
        ones(f"{p}.ln2.weight", n_embd)
        t(f"{p}.ln2.bias", n_embd, scale=0.02)
        t(f"{p}.ffn_up.weight", n_embd, n_ff)
        t(f"{p}.ffn_up.bias", n_ff, scale=0.02)
        t(f"{p}.ffn_down.weight", n_ff, n_embd)
        t(f"{p}.ffn_down.bias", n_embd, scale=0.02)
    ones("a.post_ln.weight", n_embd)
    t("a.post_ln.bias", n_embd, scale=0.02)
    t("mm.a.fc.weight", n_embd, text_n_embd, scale=0.05)
    t("mm.a.fc.bias", text_n_embd, scale=0.02)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
