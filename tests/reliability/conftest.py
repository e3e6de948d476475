"""Fixtures of the reliability suite: real routers in child processes (``routers``), the
router harness in-process (``harness``), and the store tests' fake hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest

from reliability.server import RouterProcess, alive, wait_until
from support.fixtures import harness  # noqa: F401 - the fixture, shared
from store.conftest import bus, hub, store  # noqa: F401 - the fixtures, shared


@pytest.fixture
def routers(tmp_path: Path) -> Iterator[Callable[..., RouterProcess]]:
    """Start real routers; at the end they stop and no worker of theirs may be left."""
    started: list[tuple[RouterProcess, set[int]]] = []

    def start(models: dict[str, dict[str, Any]], sub: str = "r", **kw: Any) -> RouterProcess:
        d = tmp_path / f"{sub}{len(started)}"
        d.mkdir()
        r = RouterProcess(d, models, **kw).start()
        started.append((r, set()))
        return r

    yield start
    seen: set[int] = set()
    for r, _ in started:
        if r.proc is not None and r.proc.poll() is None:
            try:
                seen.update(r.worker_pids())
            except Exception:  # noqa: BLE001 - a dead router has no list; its workers still count
                pass
        r.stop()
    wait_until(lambda: not [p for p in seen if alive(p)], 20, "workers to exit with their router")
