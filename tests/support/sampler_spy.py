"""A real worker that also writes down what reached its sampler: ``python sampler_spy.py
OUT --fd N --settings JSON`` runs ``corral.worker`` with ``slot_sampler`` wrapped so that
each request's ``wire.SamplingValues`` (and its seed) is appended to OUT as a JSON line.
Tests set ``[server] worker_command = [python, sampler_spy.py, OUT]``."""

from __future__ import annotations

import runpy
import sys
from typing import Any

import msgspec

from corral.worker.sampling import sampler


def main() -> None:
    out = sys.argv.pop(1)
    real = sampler.slot_sampler

    def spy(p: Any, **kw: Any) -> Any:
        with open(out, "ab") as f:
            f.write(msgspec.json.encode({**msgspec.to_builtins(p), "resolved_seed": kw.get("seed")}) + b"\n")
        return real(p, **kw)

    sampler.slot_sampler = spy  # type: ignore[assignment]
    runpy.run_module("corral.worker", run_name="__main__")


if __name__ == "__main__":
    main()
