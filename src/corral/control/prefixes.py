"""Prompt prefixes for slot affinity: how much of a prompt an instance served lately."""

from __future__ import annotations

__all__ = ["MIN_PREFIX", "PREFIX_KEY_CHARS", "common_prefix_len"]

MIN_PREFIX = 64  # characters in common before an instance counts as having the prefix cached
PREFIX_KEY_CHARS = 4096  # characters of each recent prompt kept per instance


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix, by binary search over C-speed slice compares."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
