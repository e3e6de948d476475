"""Fixtures for worker tests: an in-process engine and real worker processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import wire


def settings_for(model_path: Path, **kw: object) -> wire.WorkerSettings:
    base: dict[str, object] = dict(
        model_id="gemma-3-270m", model_path=str(model_path), threads=1, n_parallel=4, ctx_len=4096
    )
    base.update(kw)
    return wire.WorkerSettings(**base)  # type: ignore[arg-type]


def run_engine(engine, reqs, *, max_steps: int = 10_000):  # noqa: ANN001
    """Submit ``reqs``, step until idle; return ({id: text}, {id: final message}, {id: deltas})."""
    for r in reqs:
        engine.submit(r)
    texts: dict[str, str] = {}
    finals: dict[str, object] = {}
    deltas: dict[str, list[wire.Delta]] = {}
    for _ in range(max_steps):
        for m in engine.step():
            if isinstance(m, wire.Delta):
                texts[m.id] = texts.get(m.id, "") + m.text
                deltas.setdefault(m.id, []).append(m)
            else:
                finals[m.id] = m
        if not engine.has_work:
            break
    else:
        raise AssertionError("engine did not become idle")
    for m in engine.take_output():
        finals[m.id] = m
    return texts, finals, deltas


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[object]:
    from corral.worker.engine import Engine

    e = Engine(settings_for(model_path))
    yield e
    e.close()


# A completion reusing a slot's prefix stops where its prompt's last cut began: its last 4
# tokens decode again, in the batch shape a fresh prefill gave them (worker/prefill.py)
REUSED_TAIL = 4
