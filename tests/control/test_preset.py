"""llama.cpp presets read unchanged (corral.config.preset): the presets of llama-server's
own documentation load, every key form it accepts is honoured (long, short, LLAMA_ARG_*),
the precedence is llama-server's (command line, section, [*]), a key corral cannot honour
is an error naming file, section and key, a server-only key a warning, and bad files
(no model, 10 MB, not INI) are refused whole."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from corral.config.file import load_config
from corral.config.preset import MAX_PRESET_BYTES, parse_preset, read_preset
from corral.control.catalog import specs_from_config
from corral.errors import ConfigError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "presets"


def _fixture(tmp_path: Path, name: str, model: Path) -> Path:
    p = tmp_path / name
    p.write_text((FIXTURES / name).read_text().replace("MODEL_PATH", str(model)))
    return p


def _config(tmp_path: Path, preset: Path, **model_overrides: object) -> Path:
    toml = tmp_path / "corral.toml"
    toml.write_text(f'[server]\nmodels_preset = "{preset}"\ninclude_default_model = false\n')
    return toml


def test_the_llama_server_readme_preset_loads(tmp_path: Path, model_path: Path, caplog: pytest.LogCaptureFixture
                                              ) -> None:
    preset = _fixture(tmp_path, "llama_server_readme.ini", model_path)
    with caplog.at_level(logging.WARNING, "corral.config"):
        cfg = load_config(_config(tmp_path, preset))
    assert set(cfg.models) == {"ggml-org/MY-MODEL-GGUF:Q8_0", "custom_model"}
    s = cfg.model_settings("ggml-org/MY-MODEL-GGUF:Q8_0")
    assert (s.ctx_len, s.n_gpu_layers, s.prompt_cache_ram) == (4096, 123, 0)  # the section's c, ngl, env name
    assert s.chat_template is not None and "<|im_start|>" in s.chat_template  # chatml
    assert (s.speculative, s.draft_model) == ("draft", "/Users/abc/my-models/draft.gguf")  # the later one wins
    other = cfg.model_settings("custom_model")
    assert (other.ctx_len, other.n_gpu_layers) == (8192, 8)  # [*]
    assert {s.source for s in specs_from_config(cfg)} == {"preset"}
    assert not caplog.records  # nothing in it is ignored


def test_the_hub_preset_of_the_docs_loads_and_says_what_it_ignores(
        tmp_path: Path, model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    preset = _fixture(tmp_path, "preset_docs_hub.ini", model_path)
    with caplog.at_level(logging.WARNING, "corral.config"):
        cfg = load_config(_config(tmp_path, preset))
    s = cfg.model_settings("gpt-oss-120b-hf")
    assert (s.ctx_len, s.n_batch, s.top_p, s.top_k, s.min_p, s.temperature) == (262144, 2048, 1.0, 0, 0.01, 1.0)
    assert s.chat_template_kwargs == {"reasoning_effort": "high"}
    assert (s.n_parallel, s.speculative) == (4, "ngram")  # [*]'s parallel and spec-default
    said = " ".join(r.getMessage() for r in caplog.records)
    for key in ("mmap", "kv-unified", "ubatch-size"):
        assert f"key '{key}': ignored" in said, said


def test_every_key_form_names_the_same_option(tmp_path: Path) -> None:
    forms = {"n-gpu-layers": "7", "ngl": "7", "gpu-layers": "7", "LLAMA_ARG_N_GPU_LAYERS": "7", "--n-gpu-layers": "7"}
    for key, value in forms.items():
        p = parse_preset(f"[m]\nmodel = /m.gguf\n{key} = {value}\n", name="p.ini", base=tmp_path)
        assert p.models[0].settings["n_gpu_layers"] == 7, key
    p = parse_preset("[m]\nmodel = x.gguf\nctk = q8_0\nLLAMA_ARG_CACHE_TYPE_V = q8_0\nfa = on\n"
                     "load-on-startup = true\nstop-timeout = 3\nalias = a1,a2\nseed = -1\nn-predict = 64\n"
                     "lora-scaled = /l.gguf:0.5\nreasoning = off\n", name="p.ini", base=tmp_path)
    m = p.models[0]
    assert m.path == tmp_path / "x.gguf" and m.aliases == ["a1", "a2"]
    st = m.settings
    assert (st["cache_type_k"], st["cache_type_v"], st["flash_attn"]) == ("q8_0", "q8_0", True)
    assert (st["load_on_startup"], st["drain_timeout_s"], st["default_max_tokens"]) == (True, 3.0, 64)
    assert "seed" not in st and st["reasoning_budget"] == 0
    assert [(a.path, a.scale) for a in st["lora"]] == [("/l.gguf", 0.5)]


def test_precedence_is_command_line_then_section_then_star(tmp_path: Path, model_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text(f"[*]\nnp = 2\nc = 512\ntemp = 0.1\n[a]\nmodel = {model_path}\nnp = 3\n[b]\nmodel = {model_path}\n")
    toml = tmp_path / "c.toml"
    toml.write_text(f'[server]\nmodels_preset = "{preset}"\n[defaults]\nn_parallel = 5\ntop_k = 7\n')
    cfg = load_config(toml, model_overrides={"ctx_len": 1024})
    a, b = cfg.model_settings("a"), cfg.model_settings("b")
    assert (a.n_parallel, b.n_parallel) == (3, 2)  # section over [*] over [defaults]
    assert (a.ctx_len, b.ctx_len) == (1024, 1024)  # the command line over all
    assert (a.temperature, a.top_k) == (0.1, 7)


@pytest.mark.parametrize(("text", "says"), [
    ("[m]\nmodel = /m.gguf\nn-gpu-layer = 3\n", "p.ini: [m] key 'n-gpu-layer': not a llama-server option"),
    ("[m]\nmodel = /m.gguf\nmirostat = 2\n", "[m] key 'mirostat': not a llama-server option corral can honour"),
    ("[m]\nctx-size = 4096\n", "p.ini: [m]: no model: give model = FILE.gguf or hf-repo"),
    ("[m]\nmodel = /m.gguf\nctx-size = lots\n", "[m] key 'ctx-size': expected an integer"),
    ("[m]\nmodel = /m.gguf\ntemp = 9\n", "[m] key 'temp': Expected `float` <= 2.0"),
    ("[m]\nmodel = /m.gguf\nchat-template = vicuna-orca\n", "[m] key 'chat-template': 'vicuna-orca' is no Jinja"),
    ("[m]\nmodel = /m.gguf\njinja = false\n", "[m] key 'jinja': corral always renders"),
    ("[m]\nmodel = /m.gguf\nchat-template-kwargs = [1]\n", "expected a JSON object"),
    ("c = 5\n[m]\nmodel = /m.gguf\n", "key 'c' at top level: put it in a section"),
    ("[m\nmodel = x\n", "not a valid INI preset"),
    ("[bad id!]\nmodel = /m.gguf\n", "[bad id!]: the section name is the model's id"),
])
def test_bad_presets_are_errors_naming_file_section_and_key(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_preset(text, name="p.ini", base=tmp_path)
    assert says in str(ei.value)


def test_a_preset_of_10_mb_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    p = tmp_path / "big.ini"
    p.write_text("[m]\nmodel = /m.gguf\n" + "; padding\n" * (10 * 1024 * 1024 // 10))
    assert p.stat().st_size > MAX_PRESET_BYTES
    with pytest.raises(ConfigError, match=r"big.ini: the preset file is \d+ bytes; a preset is at most"):
        read_preset(p)


def test_a_bad_preset_leaves_the_toml_models_alone_and_names_a_clash(tmp_path: Path, model_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text(f"[m]\nmodel = {model_path}\n")
    toml = tmp_path / "c.toml"
    toml.write_text(f'[server]\nmodels_preset = "{preset}"\n[models.m]\npath = "{model_path}"\n')
    with pytest.raises(ConfigError, match=r"p.ini: \[m\]: model 'm' is in .*c.toml too"):
        load_config(toml)
    preset.write_text(f"[x]\nmodel = {model_path}\nctv = q4_0\nfa = off\n")
    with pytest.raises(ConfigError, match=r"p.ini: \[x\] key 'cache_type_v': q4_0 \(a quantized V cache\) needs"):
        load_config(toml)
