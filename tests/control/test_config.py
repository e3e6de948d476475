"""Config: schema, precedence, errors that name file/table/key, the example file."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.units import parse_bytes
from corral.config.file import load_config
from corral.control.catalog import specs_from_config
from corral.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "corral.toml"
    p.write_text(text)
    return p


def test_example_config_is_valid() -> None:
    cfg = load_config(ROOT / "examples" / "corral.toml")
    assert cfg.models, "the example should show at least one model"
    assert cfg.server.memory_budget is not None
    specs = specs_from_config(cfg)
    assert {s.id for s in specs} == set(cfg.models)


def test_defaults_model_table_and_command_line_precedence(tmp_path: Path) -> None:
    p = write(tmp_path, """
[defaults]
ctx_len = 2048
n_parallel = 2
threads = 3

[models."llama-3.2-1b"]
path = "models/llama.gguf"
n_parallel = 8
aliases = ["small"]
""")
    cfg = load_config(p, model_overrides={"threads": 1})
    s = cfg.model_settings("llama-3.2-1b")
    assert s.ctx_len == 2048  # from [defaults]
    assert s.n_parallel == 8  # model table beats defaults
    assert s.threads == 1  # command line beats both
    assert cfg.models["llama-3.2-1b"].path == tmp_path / "models" / "llama.gguf"  # relative to the file


def test_unknown_key_names_file_table_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, '[models."a.b"]\npath = "x.gguf"\nctx_lenn = 5\n')
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = ei.value.message
    assert str(p) in msg and '[models."a.b"]' in msg and "'ctx_lenn'" in msg and "unknown key" in msg


def test_wrong_type_and_missing_path(tmp_path: Path) -> None:
    p = write(tmp_path, '[server]\nport = "eighty"\n[models.m]\nctx_len = 100\n')
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = ei.value.message
    assert "[server] key 'port'" in msg
    assert "[models.m] key 'path': required key is missing" in msg


def test_toml_syntax_error_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[server\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_alias_collision_is_an_error(tmp_path: Path) -> None:
    p = write(tmp_path, '[models.a]\npath="a.gguf"\naliases=["x"]\n[models.b]\npath="b.gguf"\naliases=["x"]\n')
    with pytest.raises(ConfigError, match="alias 'x'"):
        load_config(p)


def test_sizes() -> None:
    assert parse_bytes("8GiB") == 8 * 1024**3
    assert parse_bytes("512 MB") == 512 * 1000**2
    assert parse_bytes(1234) == 1234
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_bad_memory_budget_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[server\] key 'memory_budget'.*not a size"):
        load_config(write(tmp_path, '[server]\nmemory_budget = "8 parsecs"\n'))


def test_bad_command_line_override() -> None:
    with pytest.raises(ConfigError, match="<command line>.*'n_parallel'"):
        load_config(None, model_overrides={"n_parallel": 0})
