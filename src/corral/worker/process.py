"""The worker process: socket IO around the engine.

    python -m corral.worker --fd N --settings JSON   (or --settings-file PATH)

Threads:

- reader (daemon): ``recv`` on the socket, split frames, decode ``wire.ToWorker``,
  tokenize and size-check each GenerateRequest (``engine.prepare``, worker/prompt/prompts.py:
  a huge prompt never stalls the decode loop), put them into ``inbox`` (a
  ``queue.SimpleQueue``) in wire order. EOF or a broken frame puts ``_EOF``.
- renderers (``_Renderers``, 2 daemon threads): a request with chat messages (a
  GenerateRequest or a TokenizeRequest) is prepared there, not in the reader: its chat
  template renders within its bounds (up to ``chat_template_time_s``), and meanwhile the
  reader goes on reading and the engine serves the rest. Its result joins ``inbox`` when
  ready; an Abort read while it renders waits and follows it.
- main: the engine loop. When the engine has nothing to do it blocks on ``inbox.get()``
  (no busy spin); otherwise it drains the inbox without blocking, runs one
  ``engine.step()`` and writes all messages of that step with one ``sendall``.

The router going away closes the socket: the reader sees EOF and the loop exits 0. On
Linux ``PR_SET_PDEATHSIG`` also kills the worker if the router dies without closing.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from corral import wire
from corral.fit.plan import has_side_context  # neutral: no llama_cpp (the policy must precede it)
from corral.worker.host.cpu import ThreadGovernor, parent_running

if TYPE_CHECKING:
    from corral.worker.engine import Engine
    from corral.worker.media.steps import MediaSteps
    from corral.worker.preempt.urgent import UrgentStarts

__all__ = ["main", "serve"]

log = logging.getLogger("corral.worker")

_EOF = object()
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux libc
        log.warning("could not set PR_SET_PDEATHSIG")


class _Renderers:
    """Requests with chat messages, prepared off the reader thread (their template may take
    up to its time bound). ``put`` is how a result, and anything that must follow it (an
    Abort of the request, read while it rendered), joins the inbox."""

    def __init__(self, put: Callable[[object, str | None], None], pool: Executor | None = None) -> None:
        self._put = put
        self._pool = pool or ThreadPoolExecutor(2, thread_name_prefix="corral-render")
        self._lock = threading.Lock()
        self._held: dict[str, list[object]] = {}  # rendering: what was read for it meanwhile

    def submit(self, rid: str, work: Callable[[], object]) -> Future[None]:
        with self._lock:
            self._held[rid] = []
        return self._pool.submit(self._run, rid, work)

    def hold(self, rid: str, msg: object) -> bool:
        """Keep ``msg`` (an Abort) until ``rid`` is rendered; False if it is not rendering."""
        with self._lock:
            held = self._held.get(rid)
            if held is None:
                return False
            held.append(msg)
            return True

    def _run(self, rid: str, work: Callable[[], object]) -> None:
        try:
            result = work()
        except BaseException as exc:  # noqa: BLE001 - no request may end a renderer
            log.exception("request %s failed while rendering", rid)
            result = wire.RequestFailed(rid, "internal", f"{type(exc).__name__}: {exc}")
        with self._lock:
            self._put(result, rid)
            for msg in self._held.pop(rid, []):
                self._put(msg, None)


def _reader(sock: socket.socket, inbox: "queue.SimpleQueue[object]",
            prepare: Callable[[wire.GenerateRequest], object] | None = None,
            urgent: "UrgentStarts | None" = None,
            tokenize: Callable[[wire.TokenizeRequest], object] | None = None,
            media: "MediaSteps | None" = None) -> None:
    dec = wire.FrameDecoder()

    def put(msg: object, rid: str | None) -> None:
        if urgent is not None:  # a request behind a Preempt aborts the running decode
            urgent.put(inbox, msg, rid)
        else:
            inbox.put(msg)

    renderers = _Renderers(put)
    # a request that carries media is prepared (its images decoded, its recordings' mel
    # spectrograms computed: libmtmd's own threads) on the media room's idle-priority thread,
    # given its share of the engine's time (media/steps.py), not beside the decode threads;
    # but the windows of one recording (a media_group) do not yield to one another, as
    # their encodes do not: they are prepared side by side as other requests are
    media_renderers = _Renderers(put, media.intake) if media is not None else None
    try:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                break
            for body in dec.feed(data):
                try:
                    msg: object = wire.decode_to_worker(body)
                    rid = msg.id if isinstance(msg, wire.GenerateRequest) else None
                    if isinstance(msg, wire.Abort) and (renderers.hold(msg.id, msg) or (
                            media_renderers is not None and media_renderers.hold(msg.id, msg))):
                        continue
                    if prepare is not None and isinstance(msg, wire.GenerateRequest):
                        if (media is not None and media_renderers is not None and _has_media(msg)
                                and msg.media_group is None):
                            media.preparing(media_renderers.submit(msg.id, functools.partial(prepare, msg)))
                            continue
                        if msg.messages is not None:  # its chat template renders off the reader
                            renderers.submit(msg.id, functools.partial(prepare, msg))
                            continue
                        msg = prepare(msg)  # tokenized here, in wire order, not in the decode loop
                    if (tokenize is not None and isinstance(msg, wire.TokenizeRequest)
                            and msg.messages is not None):
                        renderers.submit(msg.id, functools.partial(tokenize, msg))
                        continue
                    put(msg, rid)
                except msgspec.DecodeError as exc:
                    # A message we cannot read is a router bug; say so, answer it if it
                    # names a request id (so nobody waits for it), and go on.
                    log.error("undecodable message from router: %s", exc)
                    rid = _request_id(body)
                    if rid is not None:
                        inbox.put(wire.RequestFailed(rid, "invalid_request", f"malformed request: {exc}"))
    except (OSError, wire.FrameTooLarge) as exc:
        log.error("socket read failed: %s", exc)
    finally:
        inbox.put(_EOF)


def _has_media(req: wire.GenerateRequest) -> bool:
    return bool(req.images) or any(m.images for m in req.messages or ())


def _preparer(engine: "Engine") -> Callable[[wire.GenerateRequest], object]:
    """engine.prepare for the reader thread: a prepared request, or its RequestFailed."""
    from corral.worker.failures import RequestRejected

    def prepare(req: wire.GenerateRequest) -> object:
        try:
            return engine.prepare(req)
        except RequestRejected as exc:
            return wire.RequestFailed(req.id, exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - no request may stop the reader
            log.exception("request %s failed while preparing", req.id)
            return wire.RequestFailed(req.id, "internal", f"{type(exc).__name__}: {exc}")

    return prepare


def _template_renderer(engine: "Engine") -> Callable[[wire.TokenizeRequest], object]:
    """A TokenizeRequest with messages (the chat as the template renders it), for a renderer
    thread: its answer, or its RequestFailed."""
    from corral.worker.failures import RequestRejected
    from corral.worker.prompt.requests import tokenize

    def render(req: wire.TokenizeRequest) -> object:
        try:
            return tokenize(engine.tok, req, engine.prompts)
        except RequestRejected as exc:
            return wire.RequestFailed(req.id, exc.code, exc.message)

    return render


def _request_id(body: bytes) -> str | None:
    try:
        raw = msgspec.msgpack.decode(body)
    except msgspec.DecodeError:
        return None
    rid = raw.get("id") if isinstance(raw, dict) else None
    return rid if isinstance(rid, str) else None


class _Writer:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.broken = False

    def send(self, msgs: Sequence[wire.FromWorker]) -> None:
        if not msgs or self.broken:
            return
        data = b"".join(wire.encode(m) for m in msgs)
        try:
            self.sock.sendall(data)
        except OSError as exc:
            log.error("socket write failed: %s", exc)
            self.broken = True


def serve(sock: socket.socket, settings: wire.WorkerSettings) -> int:
    """Run one worker on a connected socket; return the process exit code."""
    out = _Writer(sock)
    out.send([wire.Loading(os.getpid())])
    from corral.worker.model import ModelLoadError

    try:
        from corral.worker.engine import Engine

        engine = Engine(settings)
    except ModelLoadError as exc:
        log.error("load failed: %s", exc)
        out.send([wire.LoadFailed(str(exc))])
        return 1
    except Exception as exc:  # noqa: BLE001 - report anything as a load failure
        log.exception("load failed")
        out.send([wire.LoadFailed(f"the worker failed while loading ({type(exc).__name__}); "  # the message may
                                  "its log has the details")])  # name paths: clients see this one
        return 1
    log.info("ready: %s, %d slots of %d tokens, %d sampling threads", engine.info.description,
             engine.info.n_slots, engine.info.n_ctx_slot, engine.pool.n)
    out.send([wire.Ready(os.getpid(), engine.info)])

    inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
    threading.Thread(target=_reader, args=(sock, inbox, _preparer(engine), engine.preempt.urgent,
                                           _template_renderer(engine), engine.media if engine.media.on else None),
                     name="corral-reader", daemon=True).start()
    governor = ThreadGovernor(engine.m.threads, engine.set_threads, parent_running=parent_running)
    governor.enabled = governor.enabled and os.environ.get("CORRAL_ADAPTIVE_THREADS", "1") != "0"
    try:
        return _loop(engine, inbox, out, governor)
    finally:
        engine.close()


# When the engine goes from idle to busy, requests that arrive within this gap of each
# other (up to the max) start together: closed-loop clients whose requests ended in the
# same step come back a few hundred microseconds apart, and a step that prefills one
# prompt alone costs the others a step. Never applies while anything is generating.
_GATHER_GAP_S = 0.001
_GATHER_MAX_S = float(os.environ.get("CORRAL_GATHER_MAX_S", "0.004"))


def _loop(engine: "Engine", inbox: "queue.SimpleQueue[object]", out: _Writer,
          governor: ThreadGovernor) -> int:
    from corral.worker.prompt.prompts import PreparedRequest
    from corral.worker.cache.slot_files import SlotFiles

    slot_files = SlotFiles(engine)  # llama-server's slot files (deferred while their slot is busy)
    replies: list[wire.FromWorker] = []
    while True:
        was_idle = not engine.has_work
        if not was_idle:
            msg = _get_nowait(inbox)
        elif governor.enabled:
            # Idle: wake now and then so the governor's view of the other processes is
            # fresh when the next request comes (a 1-token request never runs long enough
            # to measure anything).
            try:
                msg = inbox.get(timeout=governor.interval_s)
            except queue.Empty:
                msg = None
        else:
            msg = inbox.get()
        governor.tick()
        if msg is None and not engine.has_work:
            continue
        gather_until = time.monotonic() + _GATHER_MAX_S if was_idle else 0.0
        while msg is not None:
            if msg is _EOF:
                log.info("router closed the socket; exiting")
                return 0
            if isinstance(msg, (PreparedRequest, wire.GenerateRequest, wire.EmbedRequest, wire.TokenizeRequest)):
                if isinstance(msg, (PreparedRequest, wire.GenerateRequest)):
                    engine.preempt.urgent.take(msg.req.id if isinstance(msg, PreparedRequest) else msg.id)
                engine.submit(msg)
            elif isinstance(msg, wire.Abort):
                engine.abort(msg.id)
            elif isinstance(msg, wire.Preempt):
                replies.append(engine.preempt.pause(msg.id))
            elif isinstance(msg, wire.Resume):
                engine.preempt.resume(msg.id)
            elif isinstance(msg, wire.StatsRequest):
                replies.append(engine.stats())
            elif isinstance(msg, wire.SlotFileAction):
                replies += slot_files.submit(msg)
            elif isinstance(msg, (wire.RequestFailed, wire.Tokenized)):  # from the reader or a renderer
                replies.append(msg)
            elif isinstance(msg, wire.PersistCache):  # an unload: Shutdown follows
                engine.prompt_cache.persist(engine.slots, msg)
            elif isinstance(msg, wire.Shutdown):
                out.send(engine.take_output())
                log.info("shutdown requested")
                return 0
            msg = _get_nowait(inbox)
            if msg is None and engine.has_work:
                left = gather_until - time.monotonic()
                if left > 0:
                    try:
                        msg = inbox.get(timeout=min(_GATHER_GAP_S, left))
                    except queue.Empty:
                        msg = None
        if was_idle and engine.has_work:
            governor.wake()  # the tick's window still describes the idle spell
        engine.pool.cap = governor.free_cores  # sampling threads: no more than the free cores
        msgs: list[wire.FromWorker]
        try:
            msgs = [*engine.step()]
        except Exception:  # noqa: BLE001 - the engine failed outside any one request
            log.exception("engine step failed")
            msgs = [*engine.fail_all("internal engine error (see worker log)")]
        msgs += slot_files.run_pending()
        if replies:
            msgs += replies
            replies = []
        out.send(msgs)
        if out.broken:
            return 0


def _get_nowait(inbox: "queue.SimpleQueue[object]") -> object | None:
    try:
        return inbox.get_nowait()
    except queue.Empty:
        return None


def _parse_args(argv: list[str] | None) -> tuple[int, wire.WorkerSettings]:
    ap = argparse.ArgumentParser(prog="python -m corral.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--fd", type=int, required=True, help="inherited socketpair end")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--settings", help="wire.WorkerSettings as JSON")
    g.add_argument("--settings-file", type=Path, help="file holding wire.WorkerSettings JSON")
    args = ap.parse_args(argv)
    raw = args.settings if args.settings is not None else args.settings_file.read_bytes()
    try:
        settings = msgspec.json.decode(raw, type=wire.WorkerSettings)
    except msgspec.DecodeError as exc:
        ap.error(f"bad --settings: {exc}")
    return args.fd, settings


def _cpu_wait_policy(settings: wire.WorkerSettings) -> None:
    """Shorten how long ggml's OpenMP threads spin at a barrier before sleeping (about
    0.2 ms instead of libgomp's 3 ms), unless the environment sets OMP_WAIT_POLICY or
    GOMP_SPINCOUNT. Must run before llama_cpp (libgomp) is loaded.

    A worker with a vision projector keeps libgomp's own spin (``VISION_SPINCOUNT``): its
    niced image thread (media/side.py, ``SCHED_IDLE``) runs on any core a decode thread
    leaves, and with the short spin the decode threads leave one at every wait longer than
    0.2 ms. Two streams in-process beside a ``SCHED_IDLE`` thread that only computes kept
    0.81x of their rate with the short spin and 1.02x with libgomp's.

    Long spins hurt badly when the worker's threads share cores; ``ThreadGovernor``
    avoids that case by using fewer threads. Sleeping at once (PASSIVE) is robust but
    costs a third of single-stream speed on an idle machine. Measured on 2 cores
    (tok/s, 1 / 8 streams): idle: 0.2 ms spin + governor 93 / 187, libgomp default
    93 / 184, PASSIVE 61 / 164; under load: 0.2 ms spin + governor 83-87 / 96-103,
    PASSIVE 70 / 100, 0.2 ms spin without the governor 4 / 23.
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = VISION_SPINCOUNT if has_side_context(settings) else "20000"


VISION_SPINCOUNT = "300000"  # libgomp's default


def main(argv: list[str] | None = None) -> int:
    _die_with_parent()
    fd, settings = _parse_args(argv)
    _cpu_wait_policy(settings)
    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s worker[{settings.model_id}#{settings.instance}] %(levelname)s %(message)s",
    )
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        print(f"python -m corral.worker: --fd {fd} is not an open socket: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    try:
        return serve(sock, settings)
    finally:
        try:
            sock.close()
        except OSError:
            pass
