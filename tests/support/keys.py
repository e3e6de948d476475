"""Keys files for tests: ``write_keys_file(path, alice={"scopes": ["infer"]}, ...)`` writes
one (atomically, as `corral keys` does) and returns each key's secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from corral.config.keys_file import KeySpec, hash_secret, read_keys, write_keys


def write_keys_file(path: Path, **keys: dict[str, Any]) -> dict[str, str]:
    """Replace the file with these keys (name -> KeySpec fields); their secrets by name."""
    secrets = {name: f"sk-test-{name}-0123456789abcdef" for name in keys}
    specs = {name: KeySpec(hash=hash_secret(secrets[name]), **fields) for name, fields in keys.items()}
    write_keys(path, specs)
    return secrets


def remove_key(path: Path, name: str) -> None:
    keys = read_keys(path)
    del keys[name]
    write_keys(path, keys)


def rotate_key(path: Path, name: str, secret: str) -> None:
    keys = read_keys(path)
    keys[name] = msgspec.structs.replace(keys[name], hash=hash_secret(secret))
    write_keys(path, keys)


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}
