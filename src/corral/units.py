"""Byte counts as corral reads and prints them: ``parse_bytes`` is the one reading of a size
in the config and a model's settings (``gpu_memory_margin = "1GiB"``, ``"512MB"``, a number of
bytes); ``fmt_bytes`` the one way to print one (binary units: B, KiB, MiB, GiB, TiB), for the
CLI's tables, the store's and the router's messages."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["fmt_bytes", "parse_bytes"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def fmt_bytes(n: float) -> str:
    """``n`` bytes in the largest unit that keeps it at least 1: "512 B", "2.0 KiB",
    "1.5 GiB" (one decimal above bytes; TiB for anything larger)."""
    size = float(n)
    for unit in _UNITS:
        if unit == "B" and abs(size) < 1024:
            return f"{size:.0f} B"
        if unit != "B" and (round(abs(size), 1) < 1024 or unit == _UNITS[-1]):
            return f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable: the last unit always returns")


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: Any) -> Any:
    """``"8GiB"`` -> 8589934592, ``"512MB"`` -> 512000000; anything but a string passes
    through (ValueError for a string that is not a size)."""
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
        raise ValueError(f"{value!r} is not a size; write e.g. 8GiB, 512MiB, 4GB or a number of bytes")
    return value
