"""The download child process: ``python -m corral.store.fetch``, its ``FetchRequest`` the
first frame on stdin.

It resolves the source, waits for ``Proceed``, moves the bytes into
``models_dir/.corral/partial/<key>.part`` (resuming from what is there), verifies the
sha256, fsyncs, renames to ``models_dir/<id>.gguf`` and writes the manifest last (0600, the
source's credentials redacted: corral.store.sources.redact_url; so are the failure reasons it sends).
A URL source is fetched under the address policy (corral.store.fetch_http). It
talks to the manager only through ``corral.store.messages`` frames on its stdout.
A repo's vision projector (``owner/repo[:TAG]`` with an ``mmproj*.gguf`` beside the model
file) comes along the same way, into ``models_dir/<id>.mmproj.gguf``, after the model:
one pull, one progress (over both files), the manifest naming both.

The bytes of each file move by ``corral.store.fetch_transfer.Transfer`` (retries with
backoff, resumed with HTTP Range).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import msgspec

from corral.model.gguf_header import GGUFError, read_header
from corral.store import messages as m
from corral.store.fetch_errors import Fail
from corral.store.fetch_resolve import Target, resolve
from corral.store.fetch_transfer import Transfer, disk_fail, hash_file
from corral.store.local import ModelStore, validate_model_id
from corral.store.redaction import redact_url

__all__ = ["main", "partial_paths", "Fail"]

def partial_paths(store: ModelStore, key: str) -> tuple[Path, Path]:
    """The partial file and its metadata for a download key (repo+file, or URL)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return store.partial_dir / f"{digest}.part", store.partial_dir / f"{digest}.json"


class _Channel:
    def __init__(self) -> None:
        # Our stdout carries frames only: keep a private copy, point fd 1 at stderr so
        # a stray print from a library cannot corrupt the stream.
        self._out = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)
        self._in = sys.stdin.buffer
        self._reader = m.FrameReader()
        self._pending: list[bytes] = []

    def send(self, msg: m.FromFetch) -> None:
        self._out.write(m.encode(msg))

    def receive(self) -> m.FetchRequest | m.Proceed | None:
        """The manager's next message; None once it is gone."""
        while not self._pending:
            data = os.read(self._in.fileno(), 4096)
            if not data:
                return None
            self._pending += self._reader.feed(data)
        return m.decode_to_fetch(self._pending.pop(0))

    def wait_proceed(self) -> bool:
        """False: the manager is gone or decided against it."""
        return isinstance(self.receive(), m.Proceed)


# ---------------------------------------------------------------------- the pull


class _File(msgspec.Struct, kw_only=True):
    """One file of a pull (the model, or the projector pulled with it) and where it stands."""

    target: Target
    want_sha: str | None
    final: Path
    part: Path | None = None  # None: used in place from the HF cache
    meta_path: Path | None = None
    have: int = 0


def _prepare(store: ModelStore, f: _File, source: str) -> None:
    """Lock and open the file's partial file (what it already has: ``have``)."""
    if f.target.cached_path is not None:
        f.have = f.target.total or 0
        return
    try:
        store.ensure_dirs()
    except OSError as exc:
        raise disk_fail(exc, store.partial_dir) from exc
    part, meta_path = partial_paths(store, f.target.key)
    _lock(part)
    # What the partial file is. A different source naming the same file (owner/repo:TAG
    # vs owner/repo/file.gguf) shares the key and resumes it; a new size or sha256 does not.
    # the note names the file by its key as it may be shown (a URL's password is nobody's to read)
    meta = {"key": redact_url(f.target.key), "total": f.target.total, "sha256": f.want_sha}
    have = 0
    try:
        old = json.loads(meta_path.read_text())
        if {k: old.get(k) for k in meta} == meta and part.is_file():
            have = part.stat().st_size
            if f.target.total is not None and have > f.target.total:
                have = 0
    except (OSError, ValueError):
        pass
    try:
        _private_write(part, b"", keep=have > 0)
        _private_write(meta_path, json.dumps({**meta, "source": redact_url(source)}).encode())
    except OSError as exc:
        raise disk_fail(exc, part) from exc
    f.part, f.meta_path, f.have = part, meta_path, have


def _obtain(req: m.FetchRequest, f: _File, chan: _Channel, offset: int,
            grand_total: int | None) -> tuple[str | None, int]:
    """Move the file's bytes into its partial file (or check the HF cache's copy) and
    verify them: (sha256, size). Progress counts from ``offset`` of ``grand_total``."""
    if f.part is None or f.meta_path is None:
        path = Path(f.target.cached_path or "")
        sha = f.target.sha256
        if f.want_sha and sha != f.want_sha:
            h = hashlib.sha256()
            hash_file(path, h, path.stat().st_size)
            sha = h.hexdigest()
            if sha != f.want_sha:
                raise Fail("checksum", f"checksum mismatch: the cached file {path} has sha256 "
                           f"{sha}, expected {f.want_sha}")
        try:
            read_header(path)
        except (GGUFError, FileNotFoundError) as exc:
            raise Fail("invalid", f"the cached file {path.name} is not a readable GGUF file ({exc})") from None
        return sha, path.stat().st_size
    part, meta_path = f.part, f.meta_path
    xfer = Transfer(req, f.target, part, chan, offset=offset, grand_total=grand_total)
    xfer.start_from(f.have)
    xfer.report(force=True)
    xfer.run()
    xfer.report(force=True)
    got = xfer.hasher.hexdigest()
    if f.want_sha and got != f.want_sha:
        part.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)
        part.with_suffix(".lock").unlink(missing_ok=True)
        raise Fail("checksum", f"checksum mismatch: downloaded {xfer.done} bytes of {f.target.filename} with "
                   f"sha256 {got}, expected {f.want_sha}; the file was removed")
    _check_gguf(f, part, meta_path)
    return got, xfer.done


def _check_gguf(f: _File, part: Path, meta_path: Path) -> None:
    """A downloaded file whose header does not read (``corral.model.gguf_header``) is removed
    with its notes, and the pull fails saying why: nothing of it stays in models_dir."""
    try:
        read_header(part)
    except (GGUFError, FileNotFoundError) as exc:
        for p in (part, meta_path, part.with_suffix(".lock")):
            p.unlink(missing_ok=True)
        raise Fail("invalid", f"{f.target.filename} is not a readable GGUF file ({exc}); "
                   "the download was removed") from None


def _place(store: ModelStore, f: _File) -> Path:
    """A verified partial file renamed into place (fsynced); a cached file stays where it is."""
    if f.part is None or f.meta_path is None:
        return Path(f.target.cached_path or "")
    if f.final.exists():
        raise Fail("internal", f"{f.final} already exists; remove it or pull with another id")
    try:
        os.replace(f.part, f.final)
        dfd = os.open(store.root, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        raise disk_fail(exc, f.final) from exc
    return f.final


def _run(req: m.FetchRequest, chan: _Channel) -> None:
    store = ModelStore(Path(req.models_dir))
    src, target = resolve(req)
    model_id = req.model_id or src.model_id(target.filename)
    validate_model_id(model_id)
    want_sha = (req.sha256 or target.sha256 or "").lower() or None
    model = _File(target=target, want_sha=want_sha, final=store.model_file_path(model_id))
    files = [model]
    if target.projector is not None:  # the repo's vision projector comes along (corral.store.projector)
        p = target.projector
        files.append(_File(target=p, want_sha=p.sha256, final=store.projector_file_path(model_id)))
    for f in files:
        _prepare(store, f, req.source)
    totals = [f.target.total for f in files]
    grand = None if None in totals else sum(t or 0 for t in totals)
    chan.send(m.Resolved(model_id=model_id, filename=target.filename, url=redact_url(target.url or "") or None,
                         total=grand, sha256=want_sha, cached_path=target.cached_path,
                         have=sum(f.have for f in files),
                         partial_path=str(model.part) if model.part else None))
    if not chan.wait_proceed():
        return
    # every file verified before any is placed: a failed projector leaves no model half-pulled
    done = 0
    sums: list[tuple[str | None, int]] = []
    for f in files:
        sums.append(_obtain(req, f, chan, done, grand))
        done += sums[-1][1]
    paths: list[Path] = []
    try:  # a pull that fails from here on takes back the files it placed
        for f in files:
            paths.append(_place(store, f))
        (sha, size), path = sums[0], paths[0]
        projector = {"path": str(paths[1]), "sha256": sums[1][0], "size": sums[1][1]} if len(files) > 1 else None
        try:
            store.write_manifest(model_id, path=path, source=req.source, sha256=sha, size=size, projector=projector)
        except OSError as exc:
            raise disk_fail(exc, store.manifest_path(model_id)) from exc
    except BaseException:
        for f, placed in zip(files, paths):
            if f.part is not None and f.meta_path is not None:  # ours: a file in the HF cache stays
                placed.unlink(missing_ok=True)
        raise
    for f in files:  # the partial notes and locks go last
        if f.part is not None and f.meta_path is not None:
            f.meta_path.unlink(missing_ok=True)
            f.part.with_suffix(".lock").unlink(missing_ok=True)
    chan.send(m.Finished(path=str(path), sha256=sha, size=size))


_held_locks: list[int] = []


def _private_write(path: Path, data: bytes, *, keep: bool = False) -> None:
    """Write (or with ``keep``, only re-protect) an owner-only file.
    Partial downloads and their notes (the source URL) are nobody else's."""
    os.chmod(path.parent, 0o700)  # .corral/partial: other users cannot plant links in it
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (0 if keep else os.O_TRUNC), 0o600)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, 0o600)
        if data and not keep:
            os.write(fd, data)
    finally:
        os.close(fd)


def _lock(part: Path) -> None:
    """Hold an exclusive lock on ``<part>.lock`` until this process exits, so two pulls
    (two ids for one file, or the CLI and a server) never write one partial file.

    A pull that is done deletes the lock file while it still holds the lock. A pull
    that opened the file just before that would lock a deleted file while a third
    pull locks the new one; so a lock counts only when the file locked is still the
    one at the path (same inode), else it is taken again."""
    import fcntl

    lock = part.with_suffix(".lock")
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise disk_fail(exc, lock) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Fail("busy", "this file is being downloaded by another pull right now; "
                       "wait for it or cancel it") from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a file that was deleted meanwhile: lock the current one
    _held_locks.append(fd)  # released by the kernel when we exit, however we exit


def main() -> int:
    chan = _Channel()
    try:
        req = chan.receive()
    except (msgspec.DecodeError, ValueError) as exc:
        req, error = None, str(exc)
    else:
        error = "none came" if req is None else "a Proceed came first"
    if not isinstance(req, m.FetchRequest):
        chan.send(m.Failed(kind="internal", reason=f"bad fetch request: {error}"))
        return 2
    try:
        _run(req, chan)
    except Fail as exc:
        chan.send(m.Failed(kind=exc.kind, reason=redact_url(exc.reason)))
        return 1
    except Exception as exc:  # noqa: BLE001 - the manager must get a reason, not a traceback
        from corral.errors import CorralError

        reason = exc.message if isinstance(exc, CorralError) else f"{type(exc).__name__}: {exc}"
        chan.send(m.Failed(kind="invalid" if isinstance(exc, CorralError) else "internal",
                           reason=redact_url(reason)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
