"""LoRA adapters for the embedded Gemma 3 270M, made offline with the PyPI ``gguf`` writer.

``write_lora(base, dst, seed=...)``: rank 4 on ``attn_q`` and ``attn_v`` of every layer,
random weights from a fixed seed (large enough that scale 1 changes greedy tokens, small
enough that the text is still the model's own kind of text), ``general.type = adapter``,
``adapter.type = lora``, ``adapter.lora.alpha`` = the rank (so llama.cpp's
``scale * alpha / rank`` is the scale). llama.cpp's ``llama_adapter_lora_init`` and
llama-server's ``--lora`` load it. Two seeds give two different adapters.

``write_bad_lora(dst)``: a GGUF that says it is a LoRA adapter but whose tensor has a shape
no Gemma layer has (llama.cpp refuses it at load).
"""

from __future__ import annotations

from pathlib import Path

from corral.model.gguf_header import read_header

__all__ = ["LORA_RANK", "write_lora", "write_bad_lora", "lora_targets"]

LORA_RANK = 4
_TARGETS = ("attn_q", "attn_v")


def lora_targets(base: Path) -> list[tuple[str, int, int]]:
    """``(tensor name, n_in, n_out)`` of every attn_q/attn_v weight of ``base``."""
    out = []
    for t in read_header(base).tensors:  # corral's header reader: skips the vocabulary (gguf's reads it all)
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in _TARGETS and parts[3] == "weight":
            n_in, n_out = (int(x) for x in t.shape[:2])  # ggml order: ne0 = inputs, ne1 = outputs
            out.append((t.name, n_in, n_out))
    return out


def _arch(base: Path) -> str:
    return str(read_header(base, tensors=False).values["general.architecture"])


def write_lora(base: Path, dst: Path, *, seed: int = 7, std_a: float = 0.08, std_b: float = 0.08,
               rank: int = LORA_RANK) -> Path:
    """A rank-``rank`` adapter on attn_q and attn_v of every layer of ``base``."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(dst), arch=_arch(base))
    writer.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    writer.add_name(f"corral test lora seed {seed}")
    for name, n_in, n_out in lora_targets(base):
        stem = name.removesuffix(".weight")
        # numpy shapes are ggml's reversed: lora_a ne = [n_in, rank], lora_b ne = [rank, n_out]
        a = rng.normal(0.0, std_a, size=(rank, n_in)).astype(np.float32)
        b = rng.normal(0.0, std_b, size=(n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{stem}.weight.lora_a", a)
        writer.add_tensor(f"{stem}.weight.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def write_bad_lora(base: Path, dst: Path) -> Path:
    """An adapter whose one tensor pair has the wrong input size (llama.cpp refuses it)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(dst), arch=_arch(base))
    writer.add_string(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(LORA_RANK))
    name, _, n_out = lora_targets(base)[0]
    stem = name.removesuffix(".weight")
    writer.add_tensor(f"{stem}.weight.lora_a", np.zeros((LORA_RANK, 7), dtype=np.float32))
    writer.add_tensor(f"{stem}.weight.lora_b", np.zeros((n_out, LORA_RANK), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
