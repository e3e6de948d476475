"""The download child's transfer of one file: ``Transfer`` moves the bytes of a resolved
``Target`` into its partial file, hashing as it goes, with progress to the manager.

A dropped connection, a timeout, HTTP 429 or 5xx is retried ``retries`` times with
exponential backoff, each time from the bytes already written (HTTP Range); an attempt that
moved bytes resets the count. A server that ignores Range (200 instead of 206) makes it
start again from byte 0; one that sends more than it announced is a failure. A disk error is
``Fail("disk")`` naming the path (``disk_fail``). httpx is imported in the child only.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO, Protocol

from corral.store import messages as m
from corral.store.address_policy import parse_setting
from corral.store.fetch_http import open_url
from corral.store.fetch_errors import Fail, Retryable
from corral.store.fetch_resolve import Target, host_of, raise_for_status

__all__ = ["Transfer", "Sender", "disk_fail", "hash_file"]


class Sender(Protocol):
    """The child's channel to the manager (``fetch._Channel``)."""

    def send(self, msg: m.FromFetch) -> None: ...


def hash_file(path: Path, h: "hashlib._Hash", upto: int) -> None:
    """Feed ``h`` the first ``upto`` bytes of ``path`` (what a resumed transfer has already)."""
    with open(path, "rb") as f:
        left = upto
        while left > 0:
            b = f.read(min(left, 1 << 20))
            if not b:
                break
            h.update(b)
            left -= len(b)


def disk_fail(exc: OSError, where: Path) -> Fail:
    if exc.errno == errno.ENOSPC:
        return Fail("disk", f"disk full while writing {where}")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return Fail("disk", f"permission denied: cannot write to {where}")
    return Fail("disk", f"cannot write {where}: {exc.strerror or exc}")


class Transfer:
    def __init__(self, req: m.FetchRequest, target: Target, part: Path, chan: Sender, *,
                 offset: int = 0, grand_total: int | None = None) -> None:
        self.req, self.t, self.part, self.chan = req, target, part, chan
        self.hasher = hashlib.sha256()
        self.done = 0
        self.total = target.total
        self.offset, self.grand_total = offset, grand_total  # progress of the whole pull
        self._last_report = 0.0

    def start_from(self, have: int) -> None:
        self.hasher = hashlib.sha256()
        if have:
            hash_file(self.part, self.hasher, have)
        self.done = have

    def report(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_report >= self.req.progress_interval_s:
            self._last_report = now
            total = self.grand_total if self.grand_total is not None else None if self.offset else self.total
            self.chan.send(m.Progress(self.offset + self.done, total))

    def run(self) -> None:
        import httpx

        attempt = 0
        while True:
            before = self.done
            try:
                if self.total is not None and self.done >= self.total:
                    return
                self._attempt(httpx)
                return
            except Retryable as exc:
                if self.done > before:
                    attempt = 0  # it moved: a fresh set of retries
                attempt += 1
                if attempt > self.req.retries:
                    raise Fail("network", f"{exc} (gave up after {attempt} attempts)") from exc
                time.sleep(self.req.retry_backoff_s * 2 ** (attempt - 1))

    def _attempt(self, httpx) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001 - httpx is imported late, in the child
        headers = dict(self.t.headers)
        if self.done:
            headers["Range"] = f"bytes={self.done}-"
        assert self.t.url is not None
        policy = parse_setting(self.req.allow_private) if self.t.guarded else None
        try:
            with httpx.Client(timeout=httpx.Timeout(self.req.timeout_s), trust_env=policy is None) as client:
                with open_url(client, "GET", self.t.url, headers, policy) as r:
                    if r.status_code == 416 and self.done:
                        # Range beyond the end: what we have is all there is (or junk).
                        if self.total is None or self.done >= self.total:
                            return
                        self.start_from(0)
                        self._truncate()
                        raise Retryable("the server refused our Range; starting over")
                    raise_for_status(r.status_code, self.t.url)
                    if self.done and r.status_code != 206:
                        self.start_from(0)  # Range ignored: the body is the whole file
                        self._truncate()
                    if r.status_code == 200 and self.total is None:
                        cl = r.headers.get("Content-Length")
                        self.total = int(cl) if cl and cl.isdigit() else None
                    self._write_body(r)
        except httpx.HTTPError as exc:
            raise Retryable(f"connection to {host_of(self.t.url)} failed: "
                             f"{type(exc).__name__}: {exc}") from exc

    def _truncate(self) -> None:
        try:
            with open(self.part, "r+b") as f:
                f.truncate(0)
        except OSError as exc:
            raise disk_fail(exc, self.part) from exc

    def _write_body(self, r) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001 - an httpx response; httpx is imported late
        try:
            f: BinaryIO = open(self.part, "ab")
        except OSError as exc:
            raise disk_fail(exc, self.part) from exc
        with f:
            for chunk in r.iter_bytes():  # as received: a cut keeps every byte that arrived
                if self.total is not None and self.done + len(chunk) > self.total:
                    raise Fail("internal", f"the server sent more than the {self.total} bytes "
                               "it announced")
                try:
                    f.write(chunk)
                except OSError as exc:
                    raise disk_fail(exc, self.part) from exc
                self.hasher.update(chunk)
                self.done += len(chunk)
                self.report()
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                raise disk_fail(exc, self.part) from exc
        if self.total is not None and self.done < self.total:
            raise Retryable(f"the connection to {host_of(self.t.url or '')} ended early")
