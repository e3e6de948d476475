"""Fixtures of the end-to-end tests: real worker processes, the real model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from router.harness import Harness


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        await h.stop()
