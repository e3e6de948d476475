"""Presets from the Hub (corral.store.hub_preset), served by the offline fake Hub: a repo's
preset.ini becomes the server's presets (``-hf user/repo``), ``-hf user/repo:NAME`` one of
them, a repo without one is a model. llama.cpp's regression (seed 002: ``llama serve -hf
ggerganov/preset-cuda-32gb`` tried to load the model '') as a test: a server started from a
preset repo alone starts, lists the preset's models, and loads (and pulls) none it was not
asked for; the first request for one pulls it through the store, and then it answers."""

from __future__ import annotations

import asyncio
import hashlib
import stat
from pathlib import Path

import pytest

from corral.config.file import add_pulled_model, config_from_dict
from corral.errors import ConfigError
from corral.store.hub_preset import hub_preset
from support.harness import Harness
from testkit.model_settings import TEST_CTX_LEN

from .fake_hub import FakeHub

GGUF = "ggml-org/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf"
PRESET = """version = 1
[*]
c = 1024
np = 1
mmap = 1

[gemma-greedy]
hf-repo = ggml-org/gemma-3-270m-GGUF:Q4_K_M
temp = 0.0

[gemma-other]
hf = ggml-org/gemma-3-270m-GGUF:Q4_K_M
top-k = 5
load-on-startup = true
"""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 22):
            h.update(b)
    return h.hexdigest()


def test_a_repo_preset_is_kept_owner_only_and_a_named_one_alone(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("ggml-org/test-preset-ci/preset.ini", data=PRESET.encode())
    found = hub_preset("ggml-org/test-preset-ci", tmp_path / "state")
    assert found.path is not None and found.path.read_text() == PRESET
    assert stat.S_IMODE(found.path.stat().st_mode) == 0o600
    one = hub_preset("ggml-org/test-preset-ci:gemma-other", tmp_path / "state")
    assert one.path is not None and "[gemma-greedy]" not in one.path.read_text()
    assert "[gemma-other]" in one.path.read_text() and "[*]" in one.path.read_text()
    with pytest.raises(ConfigError, match=r"no preset \[nope\]"):
        hub_preset("ggml-org/test-preset-ci:nope", tmp_path / "state2")
    assert not (tmp_path / "state2").exists()  # nothing kept of a bad one
    hub.add("someone/broken/preset.ini", data=b"[x]\nctx-size = 1024\n")
    with pytest.raises(ConfigError, match=r"\[x\]: no model"):
        hub_preset("someone/broken", tmp_path / "state3")
    hub.add("someone/huge/preset.ini", data=b";" * (2 << 20))
    with pytest.raises(ConfigError, match="larger than"):
        hub_preset("someone/huge", tmp_path / "state4")
    assert hub_preset("ggml-org/gemma-3-270m-GGUF:Q4_K_M", tmp_path / "state").path is None  # a model repo
    with pytest.raises(ConfigError, match="expected user/repo"):
        hub_preset("not a repo", tmp_path / "state")


async def test_a_server_from_a_preset_repo_alone_loads_nothing_it_was_not_asked_for(
        hub: FakeHub, harness: Harness, tmp_path: Path, model_path: Path) -> None:
    hub.add("ggml-org/test-preset-ci/preset.ini", data=PRESET.encode())
    hub.add(GGUF, path=model_path, sha256=_sha256(model_path))
    found = hub_preset("ggml-org/test-preset-ci", tmp_path / "state")
    cfg = harness.config({}, models_dir=str(tmp_path / "models"), worker_command=None,
                         models_preset=str(found.path))
    plane = await harness.start(cfg, use_store=True)
    c = harness.client
    assert c is not None
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert set(listed) == {"gemma-greedy", "gemma-other"}
    assert {m["status"]["value"] for m in listed.values()} == {"unloaded"}
    assert not plane.is_loaded("gemma-greedy") and not plane.is_loaded("gemma-other")
    assert not any(r.path.endswith(".gguf") for r in hub.requests)  # nothing pulled either

    async with harness.app.state.bus.subscribe() as q:
        r = await c.post("/v1/chat/completions", json={"model": "gemma-greedy", "max_tokens": 3,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_downloading" and "Retry-After" in r.headers

        async def finished() -> dict:
            while True:
                ev = await q.get()
                if ev["event"] in ("download_finished", "download_failed"):
                    return ev

        ev = await asyncio.wait_for(finished(), 120)
    assert ev["event"] == "download_finished", ev
    r = await c.post("/v1/chat/completions", json={"model": "gemma-greedy", "max_tokens": 3,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert not plane.is_loaded("gemma-other")  # never asked for (load-on-startup waits for its file)
    assert plane.pools["gemma-greedy"].spec.temperature == 0.0


def test_a_repo_without_a_preset_is_a_model_pulled_under_its_name(tmp_path: Path) -> None:
    cfg = config_from_dict({"defaults": {"ctx_len": TEST_CTX_LEN}})
    add_pulled_model(cfg, "ggml-org/gemma-3-270m-GGUF:Q4_K_M")
    m = cfg.models["ggml-org/gemma-3-270m-GGUF:Q4_K_M"]
    assert (m.path, m.pull) == (None, "ggml-org/gemma-3-270m-GGUF:Q4_K_M")


def test_serve_names_a_bad_hf_repo_and_exits(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli.main import app

    r = CliRunner().invoke(app, ["serve", "-hf", "no-slash-here"])
    assert r.exit_code == 2 and "expected user/repo" in r.output
