"""Fixtures of the command-line tests: a real corral server (the embedded model)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.fixtures import harness  # noqa: F401 - the fixture, shared
from ui.server import CorralServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = CorralServer(tmp_path_factory.mktemp("cli-server"))
    yield srv
    srv.stop()
