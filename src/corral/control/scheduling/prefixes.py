"""Prompt prefixes for slot affinity: how much of a prompt an instance served lately."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

__all__ = ["MIN_PREFIX", "PREFIX_KEY_CHARS", "common_prefix_len", "best_for_prefix"]

T = TypeVar("T")

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


def best_for_prefix(candidates: Sequence[T], prefix: str | None, busy: Callable[[T], int],
                    recent: Callable[[T], Iterable[str]]) -> T:
    """The candidate (at least one) that served the longest part of ``prefix`` lately (at
    least ``MIN_PREFIX`` characters, else none counts), the least busy among equals."""
    if len(candidates) == 1 or not prefix:
        return min(candidates, key=busy)
    best, best_key = candidates[0], (-1, 0)
    for c in candidates:
        p = max((common_prefix_len(prefix, seen) for seen in recent(c)), default=0)
        key = (p if p >= MIN_PREFIX else 0, -busy(c))
        if key > best_key:
            best, best_key = c, key
    return best
