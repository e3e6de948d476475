"""Fixtures for store tests: a fake Hub, an isolated HF cache and models dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.events import EventBus
from corral.store.local import ModelStore

from support.fixtures import harness  # noqa: F401 - the fixture, shared

from .fake_hub import FakeHub


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    with FakeHub() as h:
        # The fetch child inherits these: huggingface_hub talks to the fake hub only,
        # and its cache is empty and private to the test.
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_HUB_CACHE", raising=False)
        monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY"):
            monkeypatch.delenv(k, raising=False)
        yield h


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    root = tmp_path / "models"
    root.mkdir()
    return ModelStore(root)


@pytest.fixture
def bus() -> EventBus:
    return EventBus()


def small_gguf(n: int = 300_000, seed: int = 1) -> bytes:
    """A file that starts like a GGUF (no keys) with ``n`` bytes of filler."""
    import random
    import struct

    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 0)
    rnd = random.Random(seed)
    return head + rnd.randbytes(n - len(head))
