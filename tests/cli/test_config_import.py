"""`corral config import` (corral.config.importer): a llama.cpp preset, an Ollama Modelfile
and a llama-swap config.yaml become a corral.toml that loads, each key that cannot be
carried over a comment at its place, never dropped."""

from __future__ import annotations

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from corral.cli.main import app
from corral.config.file import config_from_dict

FIXTURES = Path(__file__).parent.parent / "fixtures" / "presets"

SWAP = """
healthCheckTimeout: 500
macros:
  "server": "/usr/local/bin/llama-server --host 127.0.0.1 --port ${PORT}"
models:
  "qwen3-8b":
    cmd: |
      ${server}
      -m MODEL_PATH
      -ngl 99 --ctx-size 8192 -np 2
      --temp 0.6 --top-k 20 --jinja --mlock
      --mirostat 2
    aliases: ["qwen", "gpt-4o-mini"]
    ttl: 300
    proxy: http://127.0.0.1:${PORT}
  "embedder":
    cmd: ${server} -m MODEL_PATH --embedding --pooling mean --ubatch-size 2048
  "vllm-thing":
    cmd: python -m vllm.entrypoints.openai.api_server --model x
groups:
  "main":
    swap: true
    exclusive: true
    members: ["qwen3-8b", "embedder"]
"""


def _import(path: Path, *extra: str) -> str:
    r = CliRunner().invoke(app, ["config", "import", str(path), *extra])
    assert r.exit_code == 0, r.output
    return r.output


def test_a_preset_becomes_a_toml_that_loads(tmp_path: Path, model_path: Path) -> None:
    p = tmp_path / "models.ini"
    p.write_text((FIXTURES / "preset_docs_hub.ini").read_text().replace("MODEL_PATH", str(model_path))
                 + "[extra]\nmodel = x.gguf\nmirostat = 2\n")
    text = _import(p)
    cfg = config_from_dict(tomllib.loads(text), name="imported.toml", base_dir=tmp_path)
    s = cfg.model_settings("gpt-oss-120b-hf")
    assert (s.temperature, s.top_k, s.n_parallel, s.chat_template_kwargs) == (1.0, 0, 4, {"reasoning_effort": "high"})
    assert "# not carried over: ubatch-size = 2048: ignored:" in text
    assert "# not carried over: mirostat = 2: not a llama-server option corral can honour" in text


def test_a_modelfile_becomes_a_table(tmp_path: Path, model_path: Path) -> None:
    p = tmp_path / "Modelfile"
    p.write_text(f'FROM {model_path}\nPARAMETER temperature 0.7\nPARAMETER num_ctx 2048\nPARAMETER mirostat 1\n'
                 'SYSTEM """Be short."""\nTEMPLATE """{{ .Prompt }}"""\nMESSAGE user hi\nLICENSE """MIT"""\n')
    text = _import(p, "--name", "short")
    cfg = config_from_dict(tomllib.loads(text), base_dir=tmp_path)
    s = cfg.model_settings("short")
    assert (s.temperature, s.ctx_len, s.system) == (0.7, 8192, "Be short.")
    assert s.messages is not None and s.messages[0].content == "hi"
    for what in ("PARAMETER mirostat", "TEMPLATE", "LICENSE"):
        assert f"# not carried over: {what}" in text
    named = tmp_path / "Named"
    named.write_text("FROM llama3.2\nPARAMETER top_k 5\n")
    text = _import(named, "--name", "n")
    assert "# not carried over: FROM = llama3.2: a model name" in text and "top_k = 5" in text


def test_a_llama_swap_config_becomes_models(tmp_path: Path, model_path: Path) -> None:
    p = tmp_path / "config.yaml"
    p.write_text(SWAP.replace("MODEL_PATH", str(model_path)))
    text = _import(p)
    data = tomllib.loads(text)
    assert set(data["models"]) == {"qwen3-8b", "embedder"}
    cfg = config_from_dict(data, base_dir=tmp_path)
    q = cfg.model_settings("qwen3-8b")
    assert (q.n_gpu_layers, q.ctx_len, q.n_parallel, q.temperature, q.top_k, q.ttl_s) == (99, 8192, 2, 0.6, 20, 300.0)
    assert cfg.models["qwen3-8b"].aliases == ["qwen", "gpt-4o-mini"]
    assert cfg.model_settings("embedder").embedding is True
    for line in ("# not carried over: --mirostat = 2", "# not carried over: --mlock = true: ignored",
                 "# not carried over: proxy = ", "# not carried over: healthCheckTimeout = 500",
                 "# not carried over: cmd = python -m vllm", "# not carried over: group main"):
        assert line in text, line


def test_bad_files_are_named_errors(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_text("hello there\n")
    r = CliRunner().invoke(app, ["config", "import", str(p)])
    assert r.exit_code == 2 and "not a preset.ini, a Modelfile or a llama-swap config.yaml" in r.output
    r = CliRunner().invoke(app, ["config", "import", str(tmp_path / "missing.ini")])
    assert r.exit_code == 2 and "no such file" in r.output
