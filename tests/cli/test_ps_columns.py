"""`corral ps` never cuts a model id (what a person greps for and copies into the next
command), in an 80-column terminal or piped; no other column is cut either (they wrap).
The command runs as typed, over a stand-in for the server's GET /models."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest
from rich.console import Console

from corral.cli import model_cmds

LONG = "unsloth-gemma-3-270m-it-qat-GGUF-Q4_K_M-imatrix"  # 46 characters
SHORT = "gemma-3-270m"


def _model(model_id: str, pids: list[int]) -> dict[str, Any]:
    return {"id": model_id, "settings": {"ttl_s": 300}, "last_used": time.time(), "queued": 0,
            "instances": [{"index": n, "pid": pid, "state": "ready", "slots": {"busy": 0, "total": 4},
                           "memory": {"model_bytes": 253_000_000, "kv_bytes": 3 << 20}, "threads": 2,
                           "placement": [{"device": "CPU", "first_layer": 0, "layers": 18, "output": True,
                                          "weight_bytes": 200_000_000, "kv_bytes": 3 << 20, "compute_bytes": 0,
                                          "input_bytes": 50_000_000}]}
                          for n, pid in enumerate(pids)]}


class _Api:
    models_out: list[dict[str, Any]] = []

    def __init__(self, *a: object, **kw: object) -> None:
        pass

    def __enter__(self) -> "_Api":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def models(self) -> list[dict[str, Any]]:
        return self.models_out


def _ps(monkeypatch: pytest.MonkeyPatch, console: Console, models: list[dict[str, Any]]) -> list[list[str]]:
    """The rows ``corral ps`` prints, split into words (escape codes removed)."""
    monkeypatch.setattr(_Api, "models_out", models)
    monkeypatch.setattr(model_cmds, "Api", _Api)
    monkeypatch.setattr(model_cmds, "out", console)
    model_cmds.ps(host=None, port=None, server=None, as_json=False)
    assert isinstance(console.file, io.StringIO)
    text = re.sub(r"\x1b\[[0-9;]*m", "", console.file.getvalue())
    assert "…" not in text, text  # nothing is cut
    return [ln.split() for ln in text.splitlines()]


def _whole(rows: list[list[str]]) -> None:
    """Every instance on one line, every value whole (as ``ollama ps``)."""
    assert rows[0] == ["MODEL", "INSTANCE", "PID", "STATE", "SLOTS", "MEMORY", "PROCESSOR", "THREADS", "UNTIL"]
    assert [LONG, "#0", "123456", "ready", "0/4", "244.3", "MiB", "100%", "CPU", "2", "5", "min"] == rows[1][:12]
    assert ["#1", "123457", "ready", "0/4", "244.3", "MiB", "100%", "CPU", "2"] == rows[2]
    assert [SHORT, "#0", "2345678", "ready"] == rows[3][:4]


def test_an_80_column_terminal_shows_the_whole_id(monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    _whole(_ps(monkeypatch, console, [_model(LONG, [123456, 123457]), _model(SHORT, [2345678])]))


def test_an_80_column_terminal_wraps_between_words_where_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    rows = _ps(monkeypatch, console, [_model(SHORT, [2345678])])
    assert console.file.getvalue() and all(len(ln) <= 80 for ln in console.file.getvalue().splitlines())
    words = [w for r in rows for w in r]
    for want in (SHORT, "#0", "2345678", "ready", "0/4", "244.3", "MiB", "100%", "CPU", "min", "MEMORY", "PROCESSOR",
                 "UNTIL"):
        assert want in words, (want, rows)
    assert rows[1][:5] == [SHORT, "#0", "2345678", "ready", "0/4"]


def test_piped_rows_are_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: rich's 80 columns
    console = Console(file=io.StringIO())
    assert not console.is_terminal and console.width == 80
    _whole(_ps(monkeypatch, console, [_model(LONG, [123456, 123457]), _model(SHORT, [2345678])]))
