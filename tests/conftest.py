"""Shared fixtures. The real model is the embedded Gemma 3 270M (no downloads)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

# A suite started in the background by a non-interactive shell (`make test &`, nohup)
# inherits SIGINT ignored, and so would every process a test starts: the tests of Ctrl-C
# (the CLI's chat and pull, the servers' shutdown) would see nothing arrive. Children get
# the default action back when this process has a handler of its own.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def model_path() -> Path:
    from corral.store.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(autouse=True, scope="session")
def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Routers started by tests (in process or as children) keep their state (usage.db)
    in a temporary directory, never in ~/.local/state/corral, and list an empty llama.cpp
    cache. Session-wide, so that
    module-scoped servers get it too; a test that needs its own sets [server] state_dir."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORRAL_STATE_DIR", str(tmp_path_factory.mktemp("corral-state")))
        mp.setenv("LLAMA_CACHE", str(tmp_path_factory.mktemp("llama-cache")))  # never the user's
        yield


@pytest.fixture(scope="session")
def mmproj_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Gemma 3 projector for the embedded model (random weights, 16 tokens an image):
    testkit/gguf_vision.py."""
    from testkit.gguf_vision import write_gemma3_mmproj

    return write_gemma3_mmproj(tmp_path_factory.mktemp("mmproj") / "gemma3-mmproj.gguf")


@pytest.fixture(scope="session")
def audio_mmproj_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen2-Audio projector for the embedded model (random weights, 750 positions a
    30 s window): testkit/gguf_audio.py."""
    from testkit.gguf_audio import write_qwen2a_mmproj

    return write_qwen2a_mmproj(tmp_path_factory.mktemp("mmproj") / "qwen2a-mmproj.gguf")


@pytest.fixture(scope="session")
def qwen2vl_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Qwen2-VL text model and its projector (M-RoPE images; random weights, 0.4 s):
    testkit/gguf_qwen2vl.py."""
    from testkit.gguf_qwen2vl import write_qwen2vl_mmproj, write_qwen2vl_model

    d = tmp_path_factory.mktemp("qwen2vl")
    return write_qwen2vl_model(d / "qwen2vl.gguf"), write_qwen2vl_mmproj(d / "mmproj-qwen2vl.gguf")
