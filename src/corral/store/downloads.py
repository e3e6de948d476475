"""Downloads, each in its own child process (``python -m corral.store.fetch``).

The router only starts, watches and stops these children; a crash of one cannot hurt
the router. One asyncio task per pull owns the child and turns its typed messages
(``corral.store.messages``) into events on the bus:

    download_started   pull_id, total, source
    download_progress  pull_id, done, total, rate_bps, eta_s   (throttled, see below)
    download_finished  pull_id, path, sha256, size
    download_failed    pull_id, reason
    download_cancelled pull_id, done                            (never reported as failed)

Pull states: resolving -> downloading -> finished | failed | cancelled.
A failure while resolving (404, gated repo, no file with that tag, not enough disk
space) also raises from ``start()`` so the HTTP caller gets a 4xx/5xx at once.

A pull URL's credentials reach only the child (``FetchRequest``): the handle, the events,
the log and the manifest show it redacted (``redact_url``); the child fetches a URL under
the address policy (``allow_private``, corral.store.fetch_http).

Two pulls of the same source (or that resolve to the same model id) share one child
and one pull id. Cancel = SIGTERM, then SIGKILL after ``kill_after_s``; the partial
file stays, and a later pull of the same file resumes from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from corral.units import fmt_bytes
from corral.events import EventBus, EventName
from corral.errors import (
    Conflict,
    CorralError,
    DownloadCancelled,
    DownloadError,
    InsufficientStorage,
    InvalidRequest,
)
from corral.children.exits import describe_exit
from corral.store import messages as m
from corral.store.pulls import (OnFinished, ProgressThrottle, PullHandle, PullState, Rate,
                                disk_free, file_size, start_error)
from corral.store.local import ModelStore, validate_model_id
from corral.store.redaction import redact_url
from corral.store.sources import SourceError, parse_source

__all__ = ["DownloadManager", "PullHandle", "PullState", "ProgressThrottle", "disk_free"]

log = logging.getLogger("corral.downloads")

class DownloadManager:
    def __init__(
        self,
        store: ModelStore,
        bus: EventBus,
        on_finished: OnFinished | None = None,
        *,
        retries: int = 5,
        retry_backoff_s: float = 0.5,
        progress_interval_s: float = 0.5,
        resolve_timeout_s: float = 120.0,
        kill_after_s: float = 3.0,
        allow_private: Callable[[], bool | list[str]] = lambda: False,
    ) -> None:
        self.store = store
        self.bus = bus
        self.on_finished = on_finished
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.progress_interval_s = progress_interval_s
        self.resolve_timeout_s = resolve_timeout_s
        self.kill_after_s = kill_after_s
        # URL pulls' address policy, read at each pull (``allow_private_pull_urls``, which a
        # reload may change; corral.store.address_policy): true, false or CIDR networks
        self.allow_private = allow_private
        self.spawned = 0  # child processes started (tests count them)
        self._by_id: dict[str, PullHandle] = {}
        self._by_source: dict[tuple[str, str | None], PullHandle] = {}
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancelling: set[str] = set()
        self._closed = False

    # ------------------------------------------------------------------ queries
    def get(self, pull_id: str) -> PullHandle | None:
        return self._by_id.get(pull_id)

    def find_by_model(self, model_id: str) -> PullHandle | None:
        for h in self._by_id.values():
            if h.active and h.model_id == model_id:
                return h
        return None

    def progress(self, model_id: str) -> dict[str, Any] | None:
        h = self.find_by_model(model_id)
        return h.progress() if h else None

    def active(self) -> list[PullHandle]:
        return [h for h in self._by_id.values() if h.active]

    # ------------------------------------------------------------------ start
    async def start(self, source: str, sha256: str | None = None,
                    model_id: str | None = None) -> PullHandle:
        """Start (or join) a pull; returns once the file is resolved and the transfer began.

        Raises InvalidRequest / NotFound / Conflict / DownloadError when the pull cannot
        start (the same reason is published as download_failed)."""
        if self._closed:
            raise DownloadError("the download manager is shut down")
        source = source.strip()
        try:
            parsed = parse_source(source)
        except SourceError as exc:
            raise InvalidRequest(str(exc), param="model") from exc
        if sha256 is not None:
            sha256 = sha256.strip().lower()
            if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
                raise InvalidRequest("sha256 must be 64 hex digits", param="sha256")
        if model_id is not None:
            validate_model_id(model_id)
            if self.store.get(model_id) is not None:
                raise Conflict(f"model {model_id!r} already exists; remove it first",
                               param="id")

        key = (source, model_id)
        existing = self._by_source.get(key)
        if existing is not None and existing.active:
            return await self._joined(existing)

        pull_id = "pull-" + uuid.uuid4().hex[:12]
        h = PullHandle(pull_id, model_id or parsed.provisional_id, redact_url(source))  # as shown
        self._by_id[pull_id] = h
        self._by_source[key] = h
        req = m.FetchRequest(source=source, models_dir=str(self.store.root), sha256=sha256,
                             model_id=model_id, retries=self.retries,
                             retry_backoff_s=self.retry_backoff_s, allow_private=self.allow_private())
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "corral.store.fetch",  # the request goes on stdin, not argv
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C in a terminal reaches us, not the child
            )
        except OSError as exc:
            self._end(h, "failed", reason=f"cannot start the download process: {exc}")
            h._ended.set()
            raise DownloadError(h.reason or "") from exc
        self.spawned += 1
        assert proc.stdin is not None
        proc.stdin.write(m.encode(req))  # read by the child before anything else; drained with Proceed
        self._procs[pull_id] = proc
        self._tasks[pull_id] = asyncio.create_task(self._watch(h, proc), name=pull_id)
        if pull_id in self._cancelling:  # cancelled while the process was starting
            await self._stop(pull_id)
        try:
            await asyncio.wait_for(h._resolved.wait(), self.resolve_timeout_s)
        except TimeoutError:  # failed first: the watcher must not report the SIGTERM instead
            self._end(h, "failed", reason="timed out while looking up the file")
            await self._stop(pull_id)
        if h.state != "resolving":  # ended while resolving: the child is gone or going
            await h._ended.wait()
            if h.state == "cancelled":
                raise DownloadCancelled(f"pull {pull_id} was cancelled")
            raise h._error or DownloadError(h.reason or "download failed")

        # Resolved: a second pull may have resolved to the same model meanwhile.
        other = next((o for o in self.active() if o is not h and o.model_id == h.model_id), None)
        if other is not None:
            self._by_id.pop(pull_id, None)
            h.state = "cancelled"  # quietly: this pull never started as far as anyone knows
            h._ended.set()
            await self._stop(pull_id)
            self._by_source[key] = other
            return await self._joined(other)
        if model_id is None and self.store.get(h.model_id) is not None:
            err = Conflict(f"model {h.model_id!r} already exists; remove it first "
                           "or pull with another id", param="model")
            self._end(h, "failed", reason=err.message, error=err)
            await self._stop(pull_id)
            await h._ended.wait()
            raise err
        need = (h.total or 0) - h.done
        if h.path is None and need > 0:
            free = disk_free(self.store.root)
            if free < need:
                full = InsufficientStorage(
                    f"not enough disk space in {self.store.root}: the download needs "
                    f"{fmt_bytes(need)} more, {fmt_bytes(free)} is free")
                self._end(h, "failed", reason=full.message, error=full)
                await self._stop(pull_id)
                await h._ended.wait()
                raise full
        h.state = "downloading"
        self.bus.publish(EventName.DOWNLOAD_STARTED, h.model_id, pull_id=h.pull_id, total=h.total,
                         source=h.source)
        assert proc.stdin is not None
        proc.stdin.write(m.encode(m.Proceed()))
        try:
            await proc.stdin.drain()
        except (ConnectionError, BrokenPipeError):
            pass  # the child died; _watch reports it
        return h

    async def _joined(self, h: PullHandle) -> PullHandle:
        await h._resolved.wait()
        if h._error is not None:
            raise h._error
        return h

    # ------------------------------------------------------------------ cancel / close
    async def cancel(self, pull_id: str) -> bool:
        """Stop a pull; True if it was running. The partial file stays for a resume."""
        h = self._by_id.get(pull_id)
        if h is None or not h.active:
            return False
        self._cancelling.add(pull_id)
        await self._stop(pull_id)  # no process yet: start() stops it once there is one
        task = self._tasks.get(pull_id)
        if task is not None:
            await asyncio.shield(task)
        return True

    async def close(self) -> None:
        """Stop every child (partial files stay); later starts are refused."""
        self._closed = True
        for pull_id in [h.pull_id for h in self.active()]:
            await self.cancel(pull_id)
        tasks = list(self._tasks.values())  # pulls that were just ending: let them reap
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stop(self, pull_id: str) -> None:
        proc = self._procs.get(pull_id)
        if proc is None or proc.returncode is not None:
            return
        # 1. ask: SIGTERM ends the child at once (it holds no state worth saving:
        #    whatever reached the partial file is kept and verified on resume).
        with contextlib.suppress(ProcessLookupError):  # it may have just exited
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), self.kill_after_s)
        except TimeoutError:
            # 2. it did not go: SIGKILL.
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    # ------------------------------------------------------------------ the owner task
    async def _watch(self, h: PullHandle, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        reader = m.FrameReader()
        rate = Rate()
        throttle = ProgressThrottle(self.progress_interval_s)
        try:
            while h.active:
                data = await proc.stdout.read(65536)
                if not data:
                    break
                for body in reader.feed(data):
                    await self._handle(h, m.decode_from_fetch(body), rate, throttle)
                    if not h.active:
                        break
        except (msgspec.DecodeError, ValueError) as exc:
            log.error("bad message from download process %s: %s", h.pull_id, exc)
            await self._stop(h.pull_id)
        finally:
            if proc.stdin is not None:
                proc.stdin.close()  # the child needs nothing more from us
            if h.active or proc.returncode is None:
                await proc.wait()  # always reap the child
            with contextlib.suppress(Exception):  # and let its pipe close (EOF)
                await asyncio.wait_for(proc.stdout.read(), 1.0)
            if h.active:
                if h.pull_id in self._cancelling:
                    partial = file_size(h.partial_path)
                    self._end(h, "cancelled", done=partial if partial is not None else h.done)
                else:
                    self._end(h, "failed", reason="the download process exited unexpectedly "
                              f"({describe_exit(proc.returncode, detail=False)})")
            self._procs.pop(h.pull_id, None)
            self._tasks.pop(h.pull_id, None)
            self._cancelling.discard(h.pull_id)
        h._ended.set()

    async def _handle(self, h: PullHandle, msg: m.FromFetch, rate: Rate,
                throttle: ProgressThrottle) -> None:
        match msg:
            case m.Resolved():
                h.model_id = msg.model_id
                h.total = msg.total
                h.done = msg.have
                h.sha256 = msg.sha256
                h.partial_path = Path(msg.partial_path) if msg.partial_path else None
                h._resolved.set()
            case m.Progress():
                h.done, h.total = msg.done, msg.total
                h.rate_bps = rate.update(msg.done)
                h.eta_s = (round((h.total - h.done) / h.rate_bps, 1)
                           if h.total and h.rate_bps > 0 else None)
                if throttle.should_emit(h.done, h.total, h.eta_s):
                    self.bus.publish(EventName.DOWNLOAD_PROGRESS, h.model_id, **h.progress())
            case m.Finished():
                h.path, h.sha256, h.done, h.total = Path(msg.path), msg.sha256, msg.size, msg.size
                # The router learns of the model first: whoever sees download_finished
                # can use it at once.
                if self.on_finished is not None:
                    try:
                        res = self.on_finished(h.model_id, h.path)
                        if inspect.isawaitable(res):
                            await res
                    except Exception:  # the router's callback must not kill the watcher
                        log.exception("on_finished(%s) failed", h.model_id)
                self._end(h, "finished")
            case m.Failed():
                self._end(h, "failed", reason=msg.reason, error=start_error(msg))

    def _end(self, h: PullHandle, state: PullState, *, reason: str | None = None,
             done: int | None = None, error: CorralError | None = None) -> None:
        if not h.active:
            return
        was_resolving = h.state == "resolving"
        h.state = state
        h.reason = reason = redact_url(reason) if reason is not None else None
        if state == "finished":
            self.bus.publish(EventName.DOWNLOAD_FINISHED, h.model_id, pull_id=h.pull_id,
                             path=str(h.path), sha256=h.sha256, size=h.done)
        elif state == "cancelled":
            h.done = done if done is not None else h.done
            self.bus.publish(EventName.DOWNLOAD_CANCELLED, h.model_id, pull_id=h.pull_id, done=h.done)
        else:
            self.bus.publish(EventName.DOWNLOAD_FAILED, h.model_id, pull_id=h.pull_id, reason=reason)
            if was_resolving:
                h._error = error or DownloadError(reason or "download failed")
        h._resolved.set()
