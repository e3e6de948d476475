"""The ``lora`` model setting in the config file: paths resolve like the model's, ids are
unique, an unknown key in an adapter table is an error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.config.file import config_from_dict
from corral.errors import ConfigError


def _cfg(tmp_path: Path, lora: object) -> object:
    return config_from_dict({"server": {"include_default_model": False},
                             "models": {"m": {"path": "m.gguf", "lora": lora}}}, base_dir=tmp_path)


def test_adapter_paths_resolve_against_the_config_dir(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, [{"id": "a", "path": "ad/a.gguf", "scale": 0.5}, {"id": "b", "path": "/abs/b.gguf"}])
    lora = cfg.model_settings("m").lora  # type: ignore[attr-defined]
    assert [(a.id, a.path, a.scale, a.model) for a in lora] == [
        ("a", str(tmp_path / "ad/a.gguf"), 0.5, None), ("b", "/abs/b.gguf", 1.0, None)]


@pytest.mark.parametrize("lora, needle", [
    ([{"id": "a", "path": "a.gguf"}, {"id": "a", "path": "b.gguf"}], "unique"),
    ([{"id": "a", "path": "a.gguf", "rank": 4}], "rank"),
    ([{"id": "a", "path": "a.gguf", "scale": 1000}], "lora"),
    ([{"path": "a.gguf"}], "id"),
])
def test_bad_adapter_tables_are_errors(tmp_path: Path, lora: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _cfg(tmp_path, lora)
