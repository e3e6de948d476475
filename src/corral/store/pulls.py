"""A pull as the router sees it (``PullHandle``) and the small pieces the download
manager (``corral.store.downloads``) builds on: progress throttling, the transfer rate,
the error a failed lookup raises, sizes in words."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from corral.errors import (Conflict, CorralError, DownloadError, DownloadNetworkError, HubUnauthorized,
                           InsufficientStorage, InvalidRequest, NotFound, PullUrlNotAllowed)
from corral.store import messages as m

__all__ = ["PullState", "OnFinished", "PullHandle", "ProgressThrottle", "Rate", "disk_free",
           "start_error", "file_size"]

PullState = Literal["resolving", "downloading", "finished", "failed", "cancelled"]
OnFinished = Callable[[str, Path], "Awaitable[None] | None"]


def disk_free(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (tests replace this)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass
class PullHandle:
    pull_id: str
    model_id: str
    source: str
    state: PullState = "resolving"
    done: int = 0
    total: int | None = None
    rate_bps: float = 0.0
    eta_s: float | None = None
    path: Path | None = None
    sha256: str | None = None
    reason: str | None = None
    partial_path: Path | None = None
    _resolved: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _error: CorralError | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.state in ("resolving", "downloading")

    async def wait(self) -> PullState:
        """Until the pull ended, its process is reaped and ``on_finished`` returned;
        returns the final state."""
        await self._ended.wait()
        return self.state

    def progress(self) -> dict[str, Any]:
        return {"pull_id": self.pull_id, "done": self.done, "total": self.total,
                "rate_bps": round(self.rate_bps, 1), "eta_s": self.eta_s}


class ProgressThrottle:
    """Decides which progress updates become events: at most one per ``min_interval_s``,
    and only when something a person would see changed (a whole percent, or the ETA in
    whole seconds). Never one per megabyte."""

    def __init__(self, min_interval_s: float = 0.5, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._last_t: float | None = None
        self._last_key: tuple[int, int | None] | None = None

    def should_emit(self, done: int, total: int | None, eta_s: float | None) -> bool:
        now = self._clock()
        if self._last_t is not None and now - self._last_t < self.min_interval_s:
            return False
        pct = int(done * 100 / total) if total else done >> 20  # MiB when size unknown
        key = (pct, None if eta_s is None else int(eta_s))
        if key == self._last_key:
            return False
        self._last_t, self._last_key = now, key
        return True


class Rate:
    """Bytes per second over this session's transfer (bytes resumed from disk excluded)."""

    def __init__(self) -> None:
        self._t0: float | None = None
        self._d0 = 0

    def update(self, done: int) -> float:
        now = time.monotonic()
        if self._t0 is None:
            self._t0, self._d0 = now, done
            return 0.0
        dt = now - self._t0
        return (done - self._d0) / dt if dt > 0 else 0.0


def start_error(msg: m.Failed) -> CorralError:
    """The error ``start()`` raises when the pull fails before it began."""
    if msg.kind == "invalid":
        return InvalidRequest(msg.reason, param="model")
    if msg.kind == "not_found":
        return NotFound(msg.reason, param="model")
    if msg.kind == "forbidden":
        return PullUrlNotAllowed(msg.reason, param="model")
    if msg.kind == "busy":
        return Conflict(msg.reason, param="model")
    if msg.kind == "unauthorized":
        return HubUnauthorized(msg.reason, param="model")
    if msg.kind == "network":
        return DownloadNetworkError(msg.reason)
    if msg.kind == "disk":
        return InsufficientStorage(msg.reason)
    return DownloadError(msg.reason)


def file_size(path: Path | None) -> int | None:
    try:
        return path.stat().st_size if path is not None else None
    except OSError:
        return None
