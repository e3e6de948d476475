"""Shared fixtures. The real model is the embedded Gemma 3 270M (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_path() -> Path:
    from corral.store.embedded import embedded_model_path

    return embedded_model_path()
