"""`corral create NAME -f Modelfile` (cli/create_cmd.py, config/modelfile.py): a Modelfile
FROM a model and one FROM a local GGUF (uploaded as a blob) become models on a running
server; a Modelfile FROM a missing model, or with an unknown instruction, is a clear error
and creates nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from corral.cli.main import app
from corral.config.modelfile import parse_modelfile
from corral.errors import ConfigError
from support.harness import Harness

MODELFILE = '''# a comment
FROM gemma
PARAMETER temperature 0.3
PARAMETER stop "<end>"
PARAMETER stop "\\n\\n"
PARAMETER num_predict 5
SYSTEM """You are
a plumber."""
MESSAGE user Hi
MESSAGE assistant "Hello there"
LICENSE """MIT"""
'''


def test_a_modelfile_reads_as_ollama_sends_it() -> None:
    mf = parse_modelfile(MODELFILE)
    assert mf.source == "gemma" and mf.system == "You are\na plumber."
    assert mf.parameters == {"temperature": 0.3, "stop": ["<end>", "\n\n"], "num_predict": 5}
    assert mf.messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
    assert mf.license == ["MIT"]
    for bad, says in (("FROM a\nFROM b\n", "line 2: a second FROM"), ("PARAMETER temperature 1\n", "no FROM"),
                      ("FROM a\nQUANTIZE q4\n", "line 2: unknown instruction 'QUANTIZE'"),
                      ("FROM a\nSYSTEM \"\"\"open\n", "never ends"), ("FROM a\nMESSAGE bot hi\n", "takes a role")):
        with pytest.raises(ConfigError, match=says):
            parse_modelfile(bad)


async def _invoke(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, app, list(args))


async def test_corral_create_from_a_model_and_from_a_local_gguf(
        harness: Harness, model_path: Path, tmp_path: Path) -> None:
    await harness.serve({"gemma": {"path": str(model_path)}}, worker_command=None,
                        state_dir=str(tmp_path / "state"), models_dir=str(tmp_path / "m"))
    plane = harness.plane
    mf = tmp_path / "Modelfile"
    mf.write_text(MODELFILE)
    r = await _invoke("create", "plumber", "-f", str(mf), "--server", harness.base_url)
    assert r.exit_code == 0, r.output
    assert "success" in r.output
    spec = plane.pools["plumber"].spec
    assert (spec.temperature, spec.stop, spec.default_max_tokens, spec.system) == (
        0.3, ["<end>", "\n\n"], 5, "You are\na plumber.")

    (tmp_path / "w").mkdir()
    local = tmp_path / "w" / "Modelfile"
    (tmp_path / "w" / "model.gguf").symlink_to(model_path)
    local.write_text("FROM ./model.gguf\nPARAMETER top_k 3\n")
    r = await _invoke("create", "local-one", "-f", str(local), "--server", harness.base_url)
    assert r.exit_code == 0, r.output
    assert "uploading model.gguf" in r.output and plane.pools["local-one"].spec.top_k == 3

    missing = tmp_path / "Missing"
    missing.write_text("FROM no-such-model\n")
    r = await _invoke("create", "ghost", "-f", str(missing), "--server", harness.base_url)
    assert r.exit_code == 1 and "from: model 'no-such-model' not found" in r.output
    assert "ghost" not in plane.pools
    bad = tmp_path / "Bad"
    bad.write_text("FROM gemma\nPARAMETER mirostat 2\n")
    r = await _invoke("create", "ghost", "-f", str(bad), "--server", harness.base_url)
    assert r.exit_code == 1 and "parameters.mirostat" in r.output and "ghost" not in plane.pools
