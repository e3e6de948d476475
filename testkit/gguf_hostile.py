"""Hostile GGUF files, made offline byte by byte (issue 45): what a router that lists every
``*.gguf`` in ``models_dir`` must survive. Each is refused by ``corral.model.gguf_header``
with a ``GGUFError``, never another exception.

- ``small_gguf()``: a valid GGUF of a few hundred bytes (an architecture, a block count,
  one 4x4 f32 tensor per layer): the base the hostile ones are cut from.
- ``hostile_files()``: name -> bytes, one per attack (truncated headers, counts and string
  lengths of 2^62, arrays of 2^62 u64 in 49 bytes, arrays nested 3,000 deep, offsets past
  the end, wrong-typed or zero alignment, not GGUF, 0 bytes).
- ``many_tensors(n)``: a file that names ``n`` tensors (4,000,000 make 96 MB).
"""

from __future__ import annotations

import struct

__all__ = ["small_gguf", "hostile_files", "many_tensors", "kv", "tensor_info", "gguf"]

U8, U32, I32, U64, STRING, ARRAY = 0, 4, 5, 10, 8, 9


def _s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    """One key/value pair: ``payload`` is the value's bytes as written after the type."""
    return _s(key) + struct.pack("<I", vtype) + payload


def tensor_info(name: str, shape: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    return (_s(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
            + struct.pack("<IQ", ggml_type, offset))


def gguf(kvs: list[bytes], tensors: list[bytes], data: bytes = b"", *, n_kv: int | None = None,
         n_tensors: int | None = None, version: int = 3, align: int = 32) -> bytes:
    head = (b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                  len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(tensors))
    pad = -len(head) % align
    return head + b"\0" * pad + data


def small_gguf(n_layer: int = 2) -> bytes:
    kvs = [kv("general.architecture", STRING, _s("llama")),
           kv("general.file_type", U32, struct.pack("<I", 0)),
           kv("llama.block_count", U32, struct.pack("<I", n_layer)),
           kv("llama.attention.head_count", U32, struct.pack("<I", 2)),
           kv("llama.embedding_length", U32, struct.pack("<I", 4)),
           kv("llama.head_counts", ARRAY, struct.pack("<IQ", I32, 2) + struct.pack("<ii", 2, 2))]
    tensors = [tensor_info(f"blk.{i}.attn_q.weight", (4, 4), 0, 64 * i) for i in range(n_layer)]
    return gguf(kvs, tensors, b"\x01" * 64 * n_layer)


def many_tensors(n: int) -> bytes:
    """A header naming ``n`` zero-sized tensors (``t`` + its number), no data."""
    parts = [tensor_info(f"t{i}", (0,), 0, 0) for i in range(n)]
    return gguf([kv("general.architecture", STRING, _s("llama"))], parts)


def _nested(depth: int) -> bytes:
    """An array holding an array ... ``depth`` deep, the innermost empty of u8."""
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", U8, 0)


def hostile_files() -> dict[str, bytes]:
    good = small_gguf()
    arch = kv("general.architecture", STRING, _s("llama"))
    huge = 1 << 62
    one = [tensor_info("blk.0.attn_q.weight", (4, 4), 0, 0)]
    files = {
        "empty": b"",
        "not-gguf": b"PK\x03\x04" + b"\0" * 60,
        "magic-only": b"GGUF",
        "version-1": gguf([arch], [], version=1),
        "version-huge": gguf([arch], [], version=0xFFFFFFFF),
        "truncated-counts": good[:12],
        "truncated-kv": good[:40],
        "truncated-tensors": good[:len(good) - 64 * 2 - 40],
        # 49 bytes: the 24-byte preamble, a one-letter key, an array of 2^62 u64
        "array-2e62-u64": gguf([kv("k", ARRAY, struct.pack("<IQ", U64, huge))], [], align=1),
        "array-2e62-strings": gguf([kv("k", ARRAY, struct.pack("<IQ", STRING, huge))], [], align=1),
        "array-2e62-arrays": gguf([kv("k", ARRAY, struct.pack("<IQ", ARRAY, huge))], [], align=1),
        "nested-3000": gguf([kv("k", ARRAY, _nested(3000))], [], align=1),
        "array-unknown-type": gguf([kv("k", ARRAY, struct.pack("<IQ", 77, 1) + b"\0" * 8)], [], align=1),
        "value-unknown-type": gguf([kv("k", 77, b"\0" * 8)], [], align=1),
        "n-kv-2e62": gguf([arch], [], n_kv=huge),
        "n-tensors-2e62": gguf([arch], [], n_tensors=huge),
        "n-tensors-past-end": gguf([arch], one, n_tensors=1000),
        "string-2e62": gguf([kv("general.name", STRING, struct.pack("<Q", huge))], [], align=1),
        "key-2e62": b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", huge) + b"k",
        "tensor-name-2e62": gguf([arch], [struct.pack("<Q", huge) + b"x" * 24]),
        "tensor-dims-9": gguf([arch], [tensor_info("t", (1,) * 9, 0, 0)]),
        "tensor-shape-huge": gguf([arch], [tensor_info("t", (1 << 40, 1 << 40), 0, 0)], b"\0" * 32),
        "tensor-type-unknown": gguf([arch], [tensor_info("t", (4,), 9999, 0)], b"\0" * 32),
        "tensor-offset-past-end": gguf([arch], [tensor_info("t", (4, 4), 0, 1 << 40)], b"\0" * 64),
        "tensor-offset-unaligned": gguf([arch], [tensor_info("t", (4,), 0, 3)], b"\0" * 64),
        "tensor-twice": gguf([arch], [tensor_info("t", (4,), 0, 0), tensor_info("t", (4,), 0, 32)], b"\0" * 64),
        "key-twice": gguf([arch, arch], []),
        "alignment-zero": gguf([arch, kv("general.alignment", U32, struct.pack("<I", 0))], one, b"\0" * 64),
        "alignment-string": gguf([arch, kv("general.alignment", STRING, _s("32"))], one, b"\0" * 64),
        "alignment-three": gguf([arch, kv("general.alignment", U32, struct.pack("<I", 3))], one, b"\0" * 64),
        "key-1mib-twice": gguf([kv("k" * (1 << 20), U8, b"\0")] * 2, [], align=1),
        "tensor-1mib-name-twice": gguf([arch], [tensor_info("t" * (1 << 20), (4,), 0, 0)] * 2, b"\0" * 64),
        "alignment-1mib-string": gguf([arch, kv("general.alignment", STRING, _s("3" * (1 << 20)))], one, b"\0" * 64),
        "alignment-u64": gguf([arch, kv("general.alignment", U64, struct.pack("<Q", 1 << 62))], one, b"\0" * 64),
    }
    assert len(files["array-2e62-u64"]) == 49, len(files["array-2e62-u64"])
    return files
