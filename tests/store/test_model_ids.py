"""Model ids as the ecosystem writes them (owner/repo:Q4_K_M, llama3.2:1b), and the
file names they get on disk: no traversal, no collisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.config.file import config_from_dict
from corral.control.catalog import Catalog, ModelSpec
from corral.errors import ConfigError, InvalidRequest, ModelNotFound
from corral.model.ids import file_stem, id_from_file_stem, id_problem
from corral.store.local import ModelStore, model_id_from_filename, validate_model_id

GOOD = ["gemma-3-270m", "llama3.2:1b", "llama3.2:latest", "library/llama3.2:1b",
        "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M", "hf.co/bartowski/Llama-3.2-1B-GGUF:Q4_K_M",
        "a/b", "a--b", "a_b", "owner/repo/sub/file", "x" * 200]
BAD = ["", "/a", "a/", "a//b", "a/./b", "a/../b", "../a", ".hidden", "a:b:c", "a:", "a:b/c",
       "a b", "a\\b", "a%2Fb", "a\x00b", "é", "x" * 201, "-a", ":tag"]


@pytest.mark.parametrize("mid", GOOD)
def test_valid_ids(mid: str) -> None:
    assert id_problem(mid) is None
    assert validate_model_id(mid) == mid


@pytest.mark.parametrize("mid", BAD)
def test_invalid_ids(mid: str) -> None:
    assert id_problem(mid)
    with pytest.raises(InvalidRequest, match="invalid model id"):
        validate_model_id(mid)


def test_file_stems_are_safe_and_one_to_one() -> None:
    ids = GOOD + ["a:b", "a%b", "A/B"]
    stems = [file_stem(i) for i in ids]
    assert len(set(stems)) == len(ids)  # a/b and a--b and a_b differ
    for mid, stem in zip(ids, stems):
        assert "/" not in stem and "\\" not in stem and "\x00" not in stem
        assert not stem.startswith(".") and len(stem) <= 180
        if id_problem(mid) is None and len(stem) < 180:
            assert id_from_file_stem(stem) == mid
    assert file_stem("gemma-3-270m") == "gemma-3-270m"  # plain ids keep their file names
    assert file_stem("a/b") == "a%2Fb" and file_stem("o/r:Q4_K_M") == "o%2Fr%3AQ4_K_M"
    long_a, long_b = "a/" * 99 + "x", "a/" * 99 + "y"
    assert file_stem(long_a) != file_stem(long_b) and len(file_stem(long_a)) == 180


def test_store_keeps_slash_and_colon_ids_apart(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    for mid in ("a/b", "a--b", "owner/repo:Q4_K_M"):
        path = store.model_file_path(mid)
        assert path.parent == tmp_path  # never a subdirectory, never outside
        path.write_bytes(b"GGUF" + mid.encode())
        store.write_manifest(mid, path=path, source=mid, sha256=None, size=path.stat().st_size)
        assert store.manifest_path(mid).parent == store.manifests_dir
    assert [m.id for m in store.list()] == ["a--b", "a/b", "owner/repo:Q4_K_M"]
    assert store.get("a/b").path.read_bytes() == b"GGUFa/b"  # type: ignore[union-attr]
    assert json.loads(store.manifest_path("a/b").read_text())["id"] == "a/b"
    store.remove("a/b")
    assert [m.id for m in store.list()] == ["a--b", "owner/repo:Q4_K_M"]
    assert store.model_file_path("a--b").exists()
    # a manifest whose file name does not belong to the id it claims is ignored
    (store.manifests_dir / "other.json").write_text(json.dumps(
        {"id": "a--b", "path": str(store.model_file_path("a--b")), "size": 1}))
    (store.manifests_dir / "evil.json").write_text(json.dumps(
        {"id": "../../evil", "path": str(store.model_file_path("a--b")), "size": 1}))
    assert [m.id for m in store.list()] == ["a--b", "owner/repo:Q4_K_M"]
    # a pulled file whose manifest is gone lists under its id again, not a mangled name
    store.manifest_path("owner/repo:Q4_K_M").unlink()
    assert "owner/repo:Q4_K_M" in [m.id for m in store.list()]
    assert model_id_from_filename("Llama 3.gguf") == "Llama-3"


def test_config_accepts_hub_and_ollama_ids(tmp_path: Path) -> None:
    cfg = config_from_dict({"models": {
        "ggml-org/gemma-3-1b-it-GGUF:Q4_K_M": {"path": "a.gguf"},
        "llama3.2:1b": {"path": "b.gguf", "aliases": ["small"]}}}, base_dir=tmp_path)
    assert set(cfg.models) == {"ggml-org/gemma-3-1b-it-GGUF:Q4_K_M", "llama3.2:1b"}
    with pytest.raises(ConfigError, match=r"not a valid model id.*'\.\.'"):
        config_from_dict({"models": {"a/../b": {"path": "a.gguf"}}}, name="c.toml")
    with pytest.raises(ConfigError, match="not a valid model id"):
        config_from_dict({"models": {"a b": {"path": "a.gguf"}}}, name="c.toml")


def test_implicit_latest_tag_resolves() -> None:
    cat = Catalog([ModelSpec(id="llama3.2:latest", path=Path("/a.gguf")),
                   ModelSpec(id="gemma", path=Path("/b.gguf")),
                   ModelSpec(id="o/r:Q4_K_M", path=Path("/c.gguf"))])
    assert cat.resolve_id("llama3.2") == "llama3.2:latest"
    assert cat.resolve_id("llama3.2:latest") == "llama3.2:latest"
    assert cat.resolve_id("gemma:latest") == "gemma"
    assert cat.resolve_id("o/r:Q4_K_M") == "o/r:Q4_K_M"
    with pytest.raises(ModelNotFound):
        cat.resolve_id("o/r")  # another tag is another model
    with pytest.raises(ModelNotFound):
        cat.resolve_id("gemma:1b")
