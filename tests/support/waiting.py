"""Waiting in tests for a condition with nothing to await: another thread's, another
process's or the router's internal state. Every such poll in the suite goes through here,
so none waits forever: past its deadline it fails, naming what it waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def until(pred: Callable[[], object], timeout: float = 10.0, what: str = "the condition",
          interval: float = 0.001) -> None:
    """Poll ``pred`` from a thread until it is true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(interval)


async def until_async(pred: Callable[[], object], timeout: float = 10.0, what: str = "the condition",
                      interval: float = 0.005) -> None:
    """Poll ``pred`` on the event loop until it is true; AssertionError after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(interval)
