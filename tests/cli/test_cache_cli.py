"""`corral cache ls | clear` on real prompt-cache files, and the files' own rules
(corral/state/cache_files.py): atomic, checked, capped by recency."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli.run import corral
from corral.state import cache_files
from corral.config.file import config_from_dict
from corral.control.prompt_cache import disk_settings
from corral.model.settings import ModelSettings, SettingsError


def _entry(root: Path, model: str, n: int, *, key: str = "k" * 64, state: bytes = b"s" * 1000) -> Path:
    return cache_files.write_entry(root / key[:32], key, model, list(range(n)), 0, state)


def test_ls_and_clear(tmp_path: Path) -> None:
    root = tmp_path / "prompt-cache"
    _entry(root, "alpha", 100)
    _entry(root, "beta", 200, key="b" * 64)
    (root / "junk.kv").write_bytes(b"not one")
    r = corral("cache", "ls", "--state-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "alpha" in r.stdout and "beta" in r.stdout and "2 entries" in r.stdout and "1 unreadable" in r.stdout
    r = corral("cache", "clear", "beta", "--state-dir", str(tmp_path))
    assert r.returncode == 0 and "deleted 1 entries" in r.stdout
    assert [f.model_id for f in cache_files.scan(root) if isinstance(f, cache_files.CacheFile)] == ["alpha"]
    r = corral("cache", "clear", "--state-dir", str(tmp_path))
    assert r.returncode == 0 and "deleted 2 entries" in r.stdout  # alpha and the unreadable file
    assert cache_files.total_bytes(root) == (0, 0)


def test_a_file_is_checked_whole(tmp_path: Path) -> None:
    path = _entry(tmp_path, "m", 50, state=bytes(range(256)) * 8)
    entry = cache_files.read_header(path)
    assert entry.tokens == tuple(range(50)) and cache_files.read_state(entry) == bytes(range(256)) * 8
    data = bytearray(path.read_bytes())
    data[-100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(cache_files.CacheFileError, match="checksum"):
        cache_files.read_state(entry)
    path.write_bytes(bytes(data[:-1]))
    with pytest.raises(cache_files.CacheFileError, match="truncated"):
        cache_files.read_header(path)
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".tmp-")]


def test_the_cap_drops_the_least_recently_used(tmp_path: Path) -> None:
    paths = [_entry(tmp_path, "m", 10 + i) for i in range(4)]
    for i, p in enumerate(paths):
        os.utime(p, (1000.0 + i, 1000.0 + i))
    cache_files.touch(paths[0], 2000.0)  # used last
    size = paths[0].stat().st_size
    removed = cache_files.enforce_cap(tmp_path, 2 * size + size // 2)
    assert set(removed) == {paths[1], paths[2]}


def test_settings_take_sizes() -> None:
    assert ModelSettings.check_partial({"prompt_cache_ram": "2GiB"}) == {"prompt_cache_ram": 2 * 1024**3}
    assert ModelSettings.check_partial({"prompt_cache_ram": 0}) == {"prompt_cache_ram": 0}
    with pytest.raises(SettingsError, match="prompt_cache_ram: 'lots' is not a size"):
        ModelSettings.check_partial({"prompt_cache_ram": "lots"})
    with pytest.raises(SettingsError, match="prompt_cache_ram"):
        ModelSettings.check_partial({"prompt_cache_ram": -1})
    cfg = config_from_dict({"server": {"prompt_cache_disk": "1GiB", "state_dir": "/var/x"},
                            "defaults": {"prompt_cache_ram": "512MiB"}}, name="t.toml", base_dir=Path("/"))
    disk = disk_settings(cfg.server)
    assert disk is not None and disk.max_bytes == 1024**3 and disk.dir == "/var/x/prompt-cache"
    assert cfg.inherited_settings().prompt_cache_ram == 512 * 1024**2
    off = config_from_dict({"server": {"prompt_cache_disk": 0}}, name="t.toml", base_dir=Path("/"))
    assert disk_settings(off.server) is None
