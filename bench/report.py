"""The report: markdown tables (printed, and written to bench/results/ with the raw data),
the row formats every load table shares, and the ratios of each run with ``--repeat``."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from bench.clients.loadgen import LoadResult, fmt
from bench.servers import RESULTS


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        if self.rows:
            out.append("| " + " | ".join(self.columns) + " |")
            out.append("|" + "|".join("---" for _ in self.columns) + "|")
            for r in self.rows:
                out.append("| " + " | ".join(r) + " |")
        else:
            out.append("(no rows)")
        if self.notes:
            out.append("")
            out.extend(f"- {n}" for n in self.notes)
        return "\n".join(out) + "\n"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}x"


LOAD_COLUMNS = ["server", "c", "requests", "tok/s", "ratio", "TTFT p50 ms", "TTFT p95 ms",
                "ITL p95 ms", "latency p50 ms", "tok/req", "errors"]


def load_row(name: str, r: LoadResult, ref: float | None) -> list[str]:
    errs = str(r.errors) + (f" ({r.status_5xx}x 5xx)" if r.status_5xx else "")
    return [name, str(r.concurrency), str(r.n_requests), fmt(r.tok_s), ratio(r.tok_s, ref),
            fmt(r.ttft_p50_ms, 0), fmt(r.ttft_p95_ms, 0), fmt(r.itl_p95_ms, 0), fmt(r.latency_p50_ms, 0),
            fmt(r.tokens_per_request, 1), errs]


def failed_row(name: str, c: int | str, why: str, ncols: int = len(LOAD_COLUMNS)) -> list[str]:
    short = why.strip().splitlines()[0][:90] if why.strip() else "failed"
    row = [name, str(c), "–", "FAILED", "–"] + ["–"] * (ncols - 6) + [short.replace("|", "/")]
    return row[:ncols]



def repeat_summary(tables: list[Table]) -> Table | None:
    """With --repeat: each ratio cell (columns named 'vs ...' or 'ratio') of each table row,
    one column per run, so a goal can be checked in every run at a glance."""
    cells: dict[tuple[str, str, str], list[str]] = {}
    for tb in tables:
        ratio_cols = [i for i, c in enumerate(tb.columns) if c.startswith("vs ") or "ratio" in c]
        for row in tb.rows:
            for i in ratio_cols:
                if i < len(row):
                    key = (tb.title.split(":")[0][:60], " / ".join(row[:2]), tb.columns[i])
                    cells.setdefault(key, []).append(row[i])
    if not cells:
        return None
    n = max(len(v) for v in cells.values())
    return Table("Ratios in each run (--repeat)", ["table", "row", "column", *[f"run {i + 1}" for i in range(n)]],
                 [[*key, *vals] for key, vals in cells.items()])


def write_results(header: list[str], tables: list[Table], footer: str) -> list[str]:
    """``bench/results/bench-<UTC time>.md`` and ``.json`` (raw numbers, per-scenario data) and
    ``latest.md``; returns the paths written."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    md = "\n".join(header) + "\n" + "\n".join(tb.markdown() for tb in tables) + "\n" + footer + "\n"
    (RESULTS / f"bench-{stamp}.md").write_text(md)
    (RESULTS / "latest.md").write_text(md)
    (RESULTS / f"bench-{stamp}.json").write_text(json.dumps(
        {"argv": sys.argv, "env": header, "tables": [
            {"title": tb.title, "columns": tb.columns, "rows": tb.rows, "notes": tb.notes, "data": tb.data}
            for tb in tables]}, indent=1, default=str))
    return [str(RESULTS / f"bench-{stamp}.md"), str(RESULTS / f"bench-{stamp}.json")]
