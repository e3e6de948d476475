"""The hostile tester's file attacks (issue 33, part 6), replayed."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import ConfigError
from corral.keys_file import name_problem, read_keys


def test_a_key_name_with_a_trailing_newline_is_refused() -> None:
    assert name_problem("alice") is None
    assert name_problem("alice\n") is not None


def test_a_non_utf8_keys_file_is_a_config_error(tmp_path: Path) -> None:
    p = tmp_path / "keys.toml"
    p.write_bytes(b"[keys.a]\nhash = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_keys(p)
