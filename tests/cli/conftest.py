"""Fixtures of the command-line tests: a real corral server (the embedded model)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.fixtures import harness  # noqa: F401 - the fixture, shared
from ui.server import CorralServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    tmp = tmp_path_factory.mktemp("cli-server")
    cfg = tmp / "corral.toml"  # `corral pull` from the loopback file server: allowed by name
    cfg.write_text('[server]\nallow_private_pull_urls = ["127.0.0.1/32"]\n')
    srv = CorralServer(tmp, args=("-c", str(cfg)))
    yield srv
    srv.stop()
