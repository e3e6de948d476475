"""Draft models made offline for the draft-model speculation tests (worker/speculation/draft.py):

``write_tiny_draft(src, dst)``: a tiny Llama (2 layers, n_embd 64, random weights from a
fixed seed) with ``src``'s whole tokenizer (every ``tokenizer.*`` key: tokens, scores,
types, special ids, flags), so llama.cpp sees the same vocabulary as ``src``'s. Its drafts
are nonsense, so the target rejects most of them: the rollback path. ``rename``: the ids of
tokens whose text is changed (a vocabulary that looks the same but is not). Needs only the
PyPI ``gguf`` package and numpy.
"""

from __future__ import annotations

from pathlib import Path

from .gguf_raw import read_kv

__all__ = ["write_tiny_draft"]

_TOKENIZERS: dict[Path, list[tuple[str, object, int, int | None]]] = {}


def _tokenizer_fields(src: Path) -> list[tuple[str, object, int, int | None]]:
    """``src``'s tokenizer keys as (name, value, type, sub_type), read once per file."""
    if src not in _TOKENIZERS:
        _TOKENIZERS[src] = [kv for kv in read_kv(src, "tokenizer.") if not kv[0].startswith("tokenizer.chat_template")]
    return _TOKENIZERS[src]


def write_tiny_draft(src: Path, dst: Path, *, seed: int = 7, n_embd: int = 64, n_layer: int = 2,
                     n_head: int = 2, n_ff: int = 128, rename: tuple[int, ...] = ()) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(dst), arch="llama")
    n_vocab = 0
    for name, value, val_type, sub_type in _tokenizer_fields(Path(src)):
        if name == "tokenizer.ggml.tokens":
            assert isinstance(value, list)
            n_vocab = len(value)
            value = [f"<renamed{i}>" if i in rename else t for i, t in enumerate(value)] if rename else value
        writer.add_key_value(name, value, val_type, sub_type=sub_type)  # type: ignore[arg-type]
    assert n_vocab > 0, f"{src} has no tokenizer.ggml.tokens"
    writer.add_name("tiny-draft")
    writer.add_context_length(32768)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.2).astype(np.float16)

    writer.add_tensor("token_embd.weight", rand(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", rand(n_embd, n_embd))
        writer.add_tensor(p + "attn_k.weight", rand(n_embd, n_embd))
        writer.add_tensor(p + "attn_v.weight", rand(n_embd, n_embd))
        writer.add_tensor(p + "attn_output.weight", rand(n_embd, n_embd))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", rand(n_ff, n_embd))
        writer.add_tensor(p + "ffn_up.weight", rand(n_ff, n_embd))
        writer.add_tensor(p + "ffn_down.weight", rand(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
