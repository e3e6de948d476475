"""llama.cpp's cache as a model source (corral.store.llama_cache): what llama-server -hf
pulled is listed under the name it was pulled by (owner/repo:TAG) with its projector, a
loose file by its stem; the store's own ids win; corral serves them in place and never
deletes there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral.errors import InvalidRequest
from corral.store.llama_cache import llama_cache_dir
from corral.store.local import LLAMA_CACHE_SOURCE, ModelStore
from support.harness import Harness


def _pulled(cache: Path, owner: str, repo: str, tag: str, file: str, model: Path, mmproj: str | None = None) -> Path:
    local = cache / f"{owner}_{repo}_{file}"
    os.symlink(model, local)
    manifest = {"ggufFile": {"rfilename": file}}
    if mmproj is not None:
        (cache / f"{owner}_{repo}_{mmproj}").write_bytes(b"GGUF")
        manifest["mmprojFile"] = {"rfilename": mmproj}
    (cache / f"manifest={owner}={repo}={tag}.json").write_text(json.dumps(manifest))
    return local


def test_llama_cache_models_are_listed_like_pulled_ones(tmp_path: Path, model_path: Path) -> None:
    cache = tmp_path / "llama.cpp"
    cache.mkdir()
    file = _pulled(cache, "ggml-org", "gemma-3-4b-it-GGUF", "Q4_K_M", "gemma-3-4b-it-Q4_K_M.gguf", model_path,
                   mmproj="mmproj-model-f16.gguf")
    _pulled(cache, "ggml-org", "tiny-GGUF", "latest", "tiny-Q8_0.gguf", model_path)
    os.symlink(model_path, cache / "loose-model-Q4_0.gguf")
    (cache / "manifest=broken=x=Q4.json").write_text("{not json")
    (cache / "manifest=gone=x=Q4.json").write_text(json.dumps({"ggufFile": {"rfilename": "nothere.gguf"}}))
    store = ModelStore(tmp_path / "models", llama_cache=cache)
    listed = {m.id: m for m in store.list()}
    assert set(listed) == {"ggml-org/gemma-3-4b-it-GGUF:Q4_K_M", "ggml-org/tiny-GGUF", "loose-model-Q4_0"}
    m = listed["ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"]
    assert (m.path, m.source) == (file, LLAMA_CACHE_SOURCE)
    assert m.mmproj == cache / "ggml-org_gemma-3-4b-it-GGUF_mmproj-model-f16.gguf"
    assert ModelStore(tmp_path / "models").list() == []  # off: nothing from there
    with pytest.raises(InvalidRequest, match="llama.cpp's cache"):
        store.remove("ggml-org/tiny-GGUF")
    assert (cache / "ggml-org_tiny-GGUF_tiny-Q8_0.gguf").exists()


def test_the_cache_directory_follows_llama_cpp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "lc"))
    assert llama_cache_dir() == tmp_path / "lc"
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert llama_cache_dir() == tmp_path / "xdg" / "llama.cpp"


async def test_a_server_lists_and_answers_a_model_of_llama_cpps_cache(
        harness: Harness, tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "llama.cpp"
    cache.mkdir()
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    _pulled(cache, "ggml-org", "gemma-3-270m-GGUF", "Q4_K_M", "gemma-3-270m-Q4_K_M.gguf", model_path)
    await harness.start(harness.config({}, models_dir=str(tmp_path / "models"), worker_command=None), use_store=True)
    c = harness.client
    assert c is not None
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert listed["ggml-org/gemma-3-270m-GGUF:Q4_K_M"]["source"] == LLAMA_CACHE_SOURCE
    r = await c.post("/v1/completions", json={"model": "ggml-org/gemma-3-270m-GGUF:Q4_K_M", "prompt": "Hi",
                                              "max_tokens": 2})
    assert r.status_code == 200, r.text
