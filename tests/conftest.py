"""Shared fixtures. The real model is the embedded Gemma 3 270M (no downloads)."""

from __future__ import annotations

import signal
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
