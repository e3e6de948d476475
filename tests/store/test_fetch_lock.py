"""The partial file's lock: a lock on a lock file deleted meanwhile does not count."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from corral.store import fetch


def test_lock_taken_on_a_deleted_file_is_taken_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    part = tmp_path / "k.part"
    lock = part.with_suffix(".lock")
    real_flock = fcntl.flock
    calls = 0

    def flock(fd: int, op: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the pull that held it finished and deleted the file right now
            lock.unlink()
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    held_before = list(fetch._held_locks)
    try:
        fetch._lock(part)
        fd = fetch._held_locks[-1]
        assert os.fstat(fd).st_ino == os.stat(lock).st_ino  # the lock is on the file at the path
    finally:
        for fd in fetch._held_locks[len(held_before):]:
            os.close(fd)
        del fetch._held_locks[len(held_before):]


def test_second_lock_on_the_same_file_is_busy(tmp_path: Path) -> None:
    part = tmp_path / "k.part"
    held_before = len(fetch._held_locks)
    try:
        fetch._lock(part)
        with pytest.raises(fetch.Fail, match="another pull"):
            fetch._lock(part)
    finally:
        for fd in fetch._held_locks[held_before:]:
            os.close(fd)
        del fetch._held_locks[held_before:]
