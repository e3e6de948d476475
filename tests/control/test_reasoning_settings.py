"""The reasoning settings in a config file and on the command line, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config.file import load_config
from corral.control.catalog import specs_from_config
from corral.errors import ConfigError


def test_reasoning_settings_from_the_config_and_the_command_line(tmp_path: Path) -> None:
    p = tmp_path / "corral.toml"
    p.write_text("""
[defaults]
reasoning_budget = 512

[models.qwen]
path = "models/qwen.gguf"
reasoning_format = "deepseek"
reasoning_budget_max = 2048
reasoning_levels = { low = 128, medium = 1024, high = 2048 }
""")
    (spec,) = specs_from_config(load_config(p))
    assert spec.reasoning_format == "deepseek" and spec.reasoning_budget == 512
    assert spec.reasoning_budget_max == 2048 and spec.reasoning_levels == {"low": 128, "medium": 1024, "high": 2048}
    (cli,) = specs_from_config(load_config(p, model_overrides={"reasoning_format": "none", "reasoning_budget": 0}))
    assert cli.reasoning_format == "none" and cli.reasoning_budget == 0
    p.write_text('[models.other]\npath = "o.gguf"\n')
    (default,) = specs_from_config(load_config(p))
    assert default.reasoning_format == "auto" and default.reasoning_budget == -1
    assert default.reasoning_budget_max is None and default.reasoning_levels["low"] == 1024


@pytest.mark.parametrize("line,key", [('reasoning_format = "think"', "reasoning_format"),
                                      ("reasoning_budget = -2", "reasoning_budget"),
                                      ("reasoning_budget_max = -1", "reasoning_budget_max"),
                                      ("reasoning_levels = { low = -5 }", "reasoning_levels")])
def test_bad_reasoning_settings_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    p = tmp_path / "corral.toml"
    p.write_text(f'[models.m]\npath = "m.gguf"\n{line}\n')
    with pytest.raises(ConfigError, match=key):
        load_config(p)
