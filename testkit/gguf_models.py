"""Small GGUF models made offline for the editor and RAG tests (and bench/checks/editors.py):

- ``write_fim_model``: the embedded Gemma 3 270M with FIM token ids (prefix, suffix,
  middle, pad, repo, file separator) pointed at its ``<unused0..5>`` tokens. llama.cpp
  and llama-server then treat it as a FIM model; its completions are meaningless but
  deterministic (greedy).
- ``write_reranker``: a tiny BERT (2 layers, n_embd 32) with a ``cls`` head and rank
  pooling, random weights from a fixed seed, a WordPiece vocabulary of a few hundred
  words and letters. Its scores are meaningless but deterministic.

Both need only the PyPI ``gguf`` package (and numpy), no network.
"""

from __future__ import annotations

from pathlib import Path

from .gguf_raw import UINT32, copy_with_kv

__all__ = ["FIM_TOKEN_IDS", "RERANK_WORDS", "write_fim_model", "write_reranker"]

# <unused0..5> in Gemma 3's vocabulary
FIM_TOKEN_IDS = {"fim_pre": 6, "fim_suf": 7, "fim_mid": 8, "fim_pad": 9, "fim_rep": 10, "fim_sep": 11}


def write_fim_model(src: Path, dst: Path, *, repo_level: bool = True) -> Path:
    """``src`` (a GGUF) copied to ``dst`` with the FIM token ids set; ``repo_level``:
    the repository and file-separator tokens too."""
    ids = dict(FIM_TOKEN_IDS)
    if not repo_level:
        del ids["fim_rep"], ids["fim_sep"]
    return copy_with_kv(src, dst, {f"tokenizer.ggml.{k}_token_id": (UINT32, v) for k, v in ids.items()})


RERANK_WORDS = ("the a an of to in is and for on with that this it as are be by was from at or what which "
                "how where when who why does do can not no yes cat cats dog dogs bird fish tree trees sun "
                "moon star sky sea water fire city paris france capital river mountain book books code "
                "python java rust function class file model models search engine query document rank "
                "score fast slow red green blue big small good bad day night time year people world house "
                "car road food apple banana music song movie game ball team play run jump eat drink read "
                "write open close hello world goodbye").split()


def write_reranker(dst: Path, *, seed: int = 1234, n_embd: int = 32, n_layer: int = 2, n_head: int = 2,
                   n_ff: int = 64, n_ctx_train: int = 512) -> Path:
    """A tiny BERT cross-encoder with rank pooling (``bert.pooling_type`` = RANK)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + list(".,?!'-:;()")
    # WordPiece as llama.cpp stores it: a word start is "\u2581word", a continuation is the bare piece
    words = ["\u2581" + w for w in RERANK_WORDS] + ["\u2581" + c for c in letters] + letters
    tokens = specials + list(dict.fromkeys(words))  # each once
    n_vocab = len(tokens)
    types = [gguf.TokenType.CONTROL] * len(specials) + [gguf.TokenType.NORMAL] * (n_vocab - len(specials))

    w = gguf.GGUFWriter(str(dst), arch="bert")
    w.add_name("corral-test-reranker")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_pad_token_id(0)
    w.add_unk_token_id(1)
    w.add_sep_token_id(3)
    w.add_mask_token_id(4)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_bos_token_id(2)
    w.add_eos_token_id(3)

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        # numpy shape is the reverse of ggml's ne
        w.add_tensor(name, (rng.standard_normal(shape[::-1]) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32))

    t("token_embd.weight", n_embd, n_vocab)
    t("token_types.weight", n_embd, 2)
    t("position_embd.weight", n_embd, n_ctx_train)
    ones("token_embd_norm.weight", n_embd)
    t("token_embd_norm.bias", n_embd, scale=0.02)
    for i in range(n_layer):
        for part in ("q", "k", "v"):
            t(f"blk.{i}.attn_{part}.weight", n_embd, n_embd)
            t(f"blk.{i}.attn_{part}.bias", n_embd, scale=0.02)
        t(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        t(f"blk.{i}.attn_output.bias", n_embd, scale=0.02)
        ones(f"blk.{i}.attn_output_norm.weight", n_embd)
        t(f"blk.{i}.attn_output_norm.bias", n_embd, scale=0.02)
        t(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        t(f"blk.{i}.ffn_up.bias", n_ff, scale=0.02)
        t(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
        t(f"blk.{i}.ffn_down.bias", n_embd, scale=0.02)
        ones(f"blk.{i}.layer_output_norm.weight", n_embd)
        t(f"blk.{i}.layer_output_norm.bias", n_embd, scale=0.02)
    t("cls.weight", n_embd, n_embd)
    t("cls.bias", n_embd, scale=0.02)
    t("cls.output.weight", n_embd, 1, scale=1.0)
    t("cls.output.bias", 1, scale=0.1)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
