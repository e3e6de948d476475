"""The GGUF header reader against hostile files (issue 45): each crafted file, a symlink loop,
a FIFO and a fuzz over real headers are a ``GGUFError`` with a reason, never another
exception, never an allocation or a read the file's size does not allow."""

from __future__ import annotations

import os
import random
import struct
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.model.gguf_header import GGUFError, GGUFHeader, read_header
from corral.store.gguf import check_file
from corral.store.gguf_meta import parameter_size
from testkit.gguf_hostile import ARRAY, STRING, U64, gguf, hostile_files, kv, many_tensors, small_gguf, tensor_info


def test_a_small_gguf_reads(tmp_path: Path) -> None:
    p = tmp_path / "good.gguf"
    p.write_bytes(small_gguf())
    h = read_header(p)
    assert h.values["llama.block_count"] == 2 and h.values["llama.head_counts"] == [2, 2]
    assert [t.name for t in h.tensors] == ["blk.0.attn_q.weight", "blk.1.attn_q.weight"]
    assert h.tensor_bytes() == {"blk.0.attn_q.weight": 64, "blk.1.attn_q.weight": 64}
    assert check_file(p).problem is None


def test_a_real_model_reads(model_path: Path) -> None:
    h = read_header(model_path)
    assert h.values["general.architecture"] == "gemma3"
    assert h.values["tokenizer.ggml.tokens"] == {"array_len": 262144}
    assert 270_000_000 > h.n_params > 200_000_000 and len(h.tensors) > 100


@pytest.mark.parametrize("name", sorted(hostile_files()))
def test_each_hostile_file_is_a_gguf_error(tmp_path: Path, name: str) -> None:
    p = tmp_path / f"{name}.gguf"
    data = hostile_files()[name]
    p.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError) as caught:
            read_header(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 10 < len(str(caught.value)) < 300, str(caught.value)
    assert peak < (4 << 20) + 3 * len(data), (name, peak)  # nothing allocated for what the file only claims
    assert check_file(p).problem == str(caught.value)


def test_a_symlink_loop_and_a_fifo_are_gguf_errors(tmp_path: Path) -> None:
    loop = tmp_path / "loop.gguf"
    os.symlink(loop, loop)
    with pytest.raises(GGUFError, match="symlink loop"):
        read_header(loop)
    assert "symlink loop" in (check_file(loop).problem or "")
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)  # opened blocking, the read would wait for a writer forever
    with pytest.raises(GGUFError, match="not a regular file"):
        read_header(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):
        read_header(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_header(tmp_path / "missing.gguf")
    assert check_file(tmp_path / "missing.gguf").problem is None  # missing is not broken


def test_layout_numbers_from_the_header_are_bounded(tmp_path: Path) -> None:
    from corral.fit.layout import read_layout

    p = tmp_path / "layers.gguf"
    p.write_bytes(gguf([kv("general.architecture", STRING, struct.pack("<Q", 5) + b"llama"),
                        kv("llama.block_count", U64, struct.pack("<Q", 1 << 40))], []))
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match="block_count"):
            read_layout(p)
        assert tracemalloc.get_traced_memory()[1] < 4 << 20
    finally:
        tracemalloc.stop()
    p.write_bytes(small_gguf())
    assert read_layout(p).n_layer == 2
    for f32 in (float("inf"), float("nan")):  # a float where a count is: read as absent, not raised
        p.write_bytes(gguf([kv("general.architecture", STRING, struct.pack("<Q", 5) + b"llama"),
                            kv("llama.block_count", 4, struct.pack("<I", 2)),
                            kv("llama.embedding_length", 6, struct.pack("<f", f32))], []))
        assert read_layout(p).n_embd == 0


def test_more_tensors_than_the_bound_are_refused_before_they_are_read(tmp_path: Path) -> None:
    p = tmp_path / "many.gguf"
    p.write_bytes(many_tensors(70_000))
    with pytest.raises(GGUFError, match="tensor count 70000"):
        read_header(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 4_000_000, 0))
    os.truncate(p, 96 << 20)  # the 96 MB of 4,000,000 tensors (sparse here): refused at byte 24
    with pytest.raises(GGUFError, match="tensor count 4000000"):
        read_header(p)


def test_the_read_is_bounded_in_time(tmp_path: Path) -> None:
    p = tmp_path / "many.gguf"
    p.write_bytes(many_tensors(60_000))
    with pytest.raises(GGUFError, match="time limit"):
        read_header(p, time_limit_s=0.0)
    assert len(read_header(p).tensors) == 60_000


def test_a_file_changed_is_checked_again(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    p.write_bytes(hostile_files()["nested-3000"])
    assert check_file(p).problem is not None
    p.write_bytes(small_gguf())
    os.utime(p, ns=(time.time_ns() + 10**9,) * 2)
    assert check_file(p).problem is None


# ------------------------------------------------------------------ fuzz


def _rich_gguf() -> bytes:
    """Every kind of value: strings, short and long arrays of numbers and of strings, an array
    of arrays, and tensors, so mutations land on each length and count."""
    s = [struct.pack("<Q", len(w)) + w for w in (b"a", b"bb", b"ccc")]
    kvs = [kv("general.architecture", STRING, struct.pack("<Q", 5) + b"llama"),
           kv("llama.block_count", 4, struct.pack("<I", 2)),
           kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 3) + b"".join(s)),
           kv("tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", 6, 70) + b"\0" * 280),
           kv("nested", ARRAY, struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", U64, 1) + b"\1" * 8),
           kv("general.alignment", 4, struct.pack("<I", 32))]
    tensors = [tensor_info("blk.0.w", (4, 4), 0, 0), tensor_info("blk.1.w", (4,), 0, 64), tensor_info("output", (2,), 0, 96)]
    return gguf(kvs, tensors, b"\2" * 128)


class _MemFile:
    """A file in memory (``memfd``): the fuzz writes thousands of them, a disk would be the cost."""

    def __init__(self) -> None:
        self.fd = os.memfd_create("gguf-fuzz")
        self.path = Path(f"/proc/self/fd/{self.fd}")

    def holding(self, data: bytes) -> Path:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)
        return self.path


_MEM = _MemFile()


def _holds(data: bytes) -> None:
    """The property: the reader answers a header or a GGUFError, and what it answers is usable."""
    path = _MEM.holding(data)
    try:
        h = read_header(path)
    except GGUFError as exc:
        assert str(exc)
        return
    assert isinstance(h, GGUFHeader)
    assert all(0 <= n <= h.file_bytes for n in h.tensor_bytes().values())
    parameter_size(h.n_params)
    read_header(path, tensors=False)


BASES = [small_gguf(), _rich_gguf()]
_U64S = [0, 1, 63, 64, 65, 255, 1 << 31, 1 << 32, (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(BASES), data=st.data())
def test_fuzz_mutated_headers(base: bytes, data: st.DataObject) -> None:
    """Hypothesis: flipped bytes, 8-byte counts and lengths overwritten with extreme values,
    cuts and splices, anywhere in a real header."""
    b = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(b) - 1))
        kind = data.draw(st.sampled_from(["byte", "u64", "u32", "cut", "splice"]))
        if kind == "byte":
            b[at] = data.draw(st.integers(0, 255))
        elif kind == "u64":
            b[at:at + 8] = struct.pack("<Q", data.draw(st.sampled_from(_U64S)))
        elif kind == "u32":
            b[at:at + 4] = struct.pack("<I", data.draw(st.sampled_from(_U64S)) & 0xFFFFFFFF)
        elif kind == "cut":
            del b[at:]
            if not b:
                break
        else:
            b[at:at] = data.draw(st.binary(max_size=24))
    _holds(bytes(b))


def test_mutation_loop_over_every_length_field() -> None:
    """Every position of both headers overwritten with an extreme 8-byte value, and 2,000
    random byte flips (a fixed seed): the same property, exhaustively where it is cheap."""
    for base in BASES:
        for at in range(0, len(base) - 4):
            for v in (1 << 62, (1 << 64) - 1, 3000):
                _holds(base[:at] + struct.pack("<Q", v) + base[at + 8:])
    rng = random.Random(45)
    for _ in range(2000):
        b = bytearray(rng.choice(BASES))
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        _holds(bytes(b))
