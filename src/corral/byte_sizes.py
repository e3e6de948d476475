"""Byte counts as corral prints them: binary units (B, KiB, MiB, GiB, TiB), the units
its settings are written in (``gpu_memory_margin = "1GiB"``, config.parse_bytes). One
function for the CLI's tables, the store's and the router's messages."""

from __future__ import annotations

__all__ = ["fmt_bytes"]

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
