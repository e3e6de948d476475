"""Pure pieces of the command line and of `corral show`: TTL countdown, GGUF metadata."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from corral.cli.model_cmds import until_unload
from corral.store.gguf import GGUFError
from corral.store.gguf_meta import read_gguf_info


def _model(ttl: float | None, last_used: float, busy: int = 0, pinned: bool = False) -> dict:
    return {"settings": {"ttl_s": ttl, "pinned": pinned}, "last_used": last_used, "queued": 0,
            "instances": [{"slots": {"busy": busy, "total": 2}}]}


def test_until_unload() -> None:
    assert until_unload(_model(None, 100.0), now=150.0) == "never (no ttl)"
    assert until_unload(_model(300, 100.0), now=150.0) == "4 min 10 s"
    assert until_unload(_model(300, 100.0), now=390.0) == "10 s"
    assert until_unload(_model(300, 100.0), now=999.0) == "0 s"
    assert until_unload(_model(300, 100.0, busy=1), now=150.0) == "busy"
    assert until_unload(_model(300, 100.0, pinned=True), now=150.0) == "pinned"


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _gguf(kv: list[tuple[str, int, bytes]], tensors: list[tuple[str, list[int]]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, vtype, raw in kv:
        out += _s(key) + struct.pack("<I", vtype) + raw
    for name, dims in tensors:
        out += _s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", 0, 0)
    return out + b"\0" * (-len(out) % 32 + 256)  # to the alignment, then the tensors' data


def test_gguf_info_reads_metadata_and_counts_parameters(tmp_path: Path) -> None:
    vocab = struct.pack("<IQ", 8, 2) + _s("a") + _s("b")  # an array of strings: skipped
    kv = [("general.architecture", 8, _s("llama")), ("general.name", 8, _s("Tiny")),
          ("general.file_type", 4, struct.pack("<I", 15)), ("llama.context_length", 4, struct.pack("<I", 4096)),
          ("tokenizer.ggml.tokens", 9, vocab), ("tokenizer.chat_template", 8, _s("{{ messages }}"))]
    p = tmp_path / "tiny.gguf"
    p.write_bytes(_gguf(kv, [("a", [4, 8]), ("b", [10])]))
    info = read_gguf_info(p)
    assert info["architecture"] == "llama" and info["name"] == "Tiny"
    assert info["quantization"] == "Q4_K_M" and info["context_length"] == 4096
    assert info["parameters"] == 42 and info["parameters_human"] == "42"
    assert info["chat_template"] == "{{ messages }}"
    kv.append(("general.parameter_count", 10, struct.pack("<Q", 7_000_000_000)))
    p.write_bytes(_gguf(kv, [("a", [4, 8])]))
    assert read_gguf_info(p)["parameters_human"] == "7B"
    p.write_bytes(b"NOPE" + bytes(20))
    with pytest.raises(GGUFError):
        read_gguf_info(p)
    p.write_bytes(_gguf(kv, [])[:40])
    with pytest.raises(GGUFError):
        read_gguf_info(p)
