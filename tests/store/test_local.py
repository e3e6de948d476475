"""ModelStore layout, GGUF header quantization, source parsing."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from corral.errors import InvalidRequest, ModelNotFound
from corral.store.gguf import quant_from_name, quantization_of, read_file_type
from corral.store.local import ModelStore, default_models_dir
from corral.store.sources import SourceError, parse_source, pick_file


def gguf_with_file_type(ft: int, *, extra_array: bool = True) -> bytes:
    """A GGUF header with a string array before general.file_type (it must be skipped)."""

    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    kvs = b""
    n = 1
    if extra_array:
        kvs += s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + s("a") + s("bb") + s("c")
        kvs += s("general.name") + struct.pack("<I", 8) + s("tiny")
        n += 2
    kvs += s("general.file_type") + struct.pack("<II", 4, ft)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n) + kvs


def test_quantization_from_header_beats_file_name(tmp_path: Path) -> None:
    p = tmp_path / "named-Q8_0.gguf"
    p.write_bytes(gguf_with_file_type(15))
    assert read_file_type(p) == 15
    assert quantization_of(p) == "Q4_K_M"
    q = tmp_path / "noheader-IQ2_XXS.gguf"
    q.write_bytes(b"not a gguf at all")
    assert quantization_of(q) == "IQ2_XXS"
    assert quant_from_name("qwen2.5-0.5b-instruct.gguf") is None
    assert quant_from_name("model-f16.gguf") == "F16"


def test_real_model_header(model_path: Path) -> None:
    assert quantization_of(model_path) == "Q4_K_M"


def test_list_loose_and_pulled_never_partial(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "m")
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "sub" / "loose-Q5_K_M.gguf").write_bytes(b"x" * 7)
    (tmp_path / "m" / "mmproj-vision-F16.gguf").write_bytes(b"x")
    (tmp_path / "m" / "notes.txt").write_text("hi")
    store.ensure_dirs()
    (store.partial_dir / "abc.part").write_bytes(b"x" * 100)
    (store.partial_dir / "abc.gguf").write_bytes(b"x" * 100)  # even a .gguf in there
    elsewhere = tmp_path / "hf-cache-file.gguf"
    elsewhere.write_bytes(gguf_with_file_type(7))
    store.write_manifest("pulled", path=elsewhere, source="o/r/f.gguf", sha256="ab" * 32, size=1)
    ids = [m.id for m in store.list()]
    assert ids == ["loose-Q5_K_M", "pulled"]
    loose, pulled = store.list()
    assert loose.size == 7 and loose.quantization == "Q5_K_M" and loose.source is None
    assert pulled.path == elsewhere and pulled.quantization == "Q8_0"
    assert pulled.source == "o/r/f.gguf" and pulled.sha256 == "ab" * 32
    assert store.get("nope") is None

    store.remove("loose-Q5_K_M")
    assert not (tmp_path / "m" / "sub" / "loose-Q5_K_M.gguf").exists()
    store.remove("pulled")  # outside models_dir: only the manifest goes
    assert elsewhere.exists() and store.list() == []
    with pytest.raises(ModelNotFound):
        store.remove("pulled")


def test_manifest_whose_file_vanished_is_not_listed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    f = tmp_path / "gone.gguf"
    f.write_bytes(b"x")
    store.write_manifest("gone", path=f, source="s", sha256=None, size=1)
    f.unlink()
    assert store.list() == []
    (store.manifests_dir / "broken.json").write_text("{not json")
    assert store.list() == []


def test_default_models_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CORRAL_MODELS_DIR", str(tmp_path / "x"))
    assert default_models_dir() == tmp_path / "x"
    monkeypatch.delenv("CORRAL_MODELS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_models_dir() == tmp_path / "corral" / "models"


def test_manifest_rejects_bad_ids(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest):
        ModelStore(tmp_path).write_manifest("../x", path=tmp_path, source="s", sha256=None, size=0)


@pytest.mark.parametrize(
    ("source", "kind", "repo", "filename", "tag", "pid"),
    [
        ("o/r/f-Q4_K_M.gguf", "hf_file", "o/r", "f-Q4_K_M.gguf", None, "f-Q4_K_M"),
        ("hf.co/o/r/sub/f.gguf", "hf_file", "o/r", "sub/f.gguf", None, "f"),
        ("o/r-GGUF:q8_0", "hf_tag", "o/r-GGUF", None, "q8_0", "o/r-GGUF:q8_0"),
        ("hf.co/o/r-GGUF:q8_0", "hf_tag", "o/r-GGUF", None, "q8_0", "hf.co/o/r-GGUF:q8_0"),
        ("o/r", "hf_tag", "o/r", None, None, "o/r"),
        ("https://h.example/x/m%20one.gguf?dl=1", "url", None, "m one.gguf", None, "m-one"),
    ],
)
def test_parse_source(source: str, kind: str, repo: str | None, filename: str | None,
                      tag: str | None, pid: str) -> None:
    p = parse_source(source)
    assert (p.kind, p.repo, p.filename, p.tag, p.provisional_id) == (kind, repo, filename, tag, pid)


@pytest.mark.parametrize("bad", ["", "justaname", "o/r/f.bin", "ftp://h/f.gguf",
                                 "https://h/", "o/r:", "o/r/../x.gguf"])
def test_parse_source_rejects(bad: str) -> None:
    with pytest.raises(SourceError):
        parse_source(bad)


def test_pick_file_like_llama_cpp() -> None:
    files = ["README.md", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf", "mmproj-m-Q4_K_M.gguf", "m-Q8_0.gguf"]
    assert pick_file(files, None, "o/r") == "m-Q4_K_M.gguf"  # default tag
    assert pick_file(files, "q4_k_s", "o/r") == "m-Q4_K_S.gguf"  # case-insensitive
    assert pick_file(["a-Q8_0.gguf"], None, "o/r") == "a-Q8_0.gguf"  # no Q4_K_M: first
    assert pick_file(["x/m-Q4_0-00001-of-00002.gguf", "y/m-Q4_0.gguf"], "Q4_0", "o/r") == "y/m-Q4_0.gguf"
    with pytest.raises(SourceError, match="split"):
        pick_file(["m-Q4_0-00001-of-00002.gguf", "m-Q4_0-00002-of-00002.gguf"], "Q4_0", "o/r")
    with pytest.raises(SourceError, match="no .gguf model files"):
        pick_file(["mmproj-x.gguf", "README.md"], None, "o/r")
