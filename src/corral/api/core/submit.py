"""Submitting a request's worker requests on behalf of an HTTP client: ``submit`` waits for
each one's first output (a stream, at most ``FIRST_OUTPUT_WAIT_S`` once a worker has it) or
its end, ``ClientWatch`` ends what Starlette does not cancel when the client leaves (that is
``ClientDisconnected``, 499, no traceback), ``observe`` counts a request in the metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from starlette.requests import Request

from corral.api.core.target import Target
from corral.api.http import plane_of
from corral.control.plane import ControlPlane
from corral.control.stream import RequestStream
from corral.errors import ClientDisconnected, CorralError

__all__ = ["ClientWatch", "FIRST_OUTPUT_WAIT_S", "observe", "submit"]


class ClientWatch:
    """Ends the parts of a request Starlette does not cancel on disconnect (queueing,
    loading, non-streamed results) when the client goes away: a watcher reads the
    connection, and its end cancels the task that awaits in ``run``. Awaiting in ``run``
    costs nothing more than a plain await (no task, no ``asyncio.wait`` per await); call
    ``close()`` before the task moves on to other work."""

    __slots__ = ("_request", "_watcher", "_task", "gone")

    def __init__(self, request: Request) -> None:
        self._request = request
        self._watcher: asyncio.Future[None] | None = None
        self._task: asyncio.Task[Any] | None = None
        self.gone = False

    async def run(self, aw: Awaitable[Any]) -> Any:
        if self._watcher is None:
            self._task = asyncio.current_task()
            self._watcher = asyncio.ensure_future(_disconnected(self._request))
            self._watcher.add_done_callback(self._on_watcher_done)
        if self.gone:
            if asyncio.isfuture(aw):
                aw.cancel()
            elif asyncio.iscoroutine(aw):
                aw.close()
            raise asyncio.CancelledError("client disconnected")
        return await aw

    def _on_watcher_done(self, watcher: asyncio.Future[None]) -> None:
        if watcher.cancelled() or watcher.exception() is not None or self._task is None:
            return
        self.gone = True
        self._task.cancel("client disconnected")

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.remove_done_callback(self._on_watcher_done)
            self._watcher.cancel()
        self._task = None


async def _disconnected(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def observe(plane: ControlPlane, stream: RequestStream, endpoint: str, status: int) -> None:
    fin = stream.finished
    inst = stream.instance_index
    end = stream.ended or time.perf_counter()
    plane.metrics.observe_request(
        stream.model, inst, endpoint, status,
        prompt_tokens=fin.usage.prompt_tokens if fin else 0,
        completion_tokens=fin.usage.completion_tokens if fin else 0,
        ttft_s=(stream.first_token - stream.created) if stream.first_token else None,
        latency_s=end - stream.created)


async def submit(request: Request, target: Target, endpoint: str, coros: list[Awaitable[RequestStream]],
                 *, wait_all: bool) -> list[RequestStream]:
    """Submit requests (one per choice) to ``target`` (resolved once: api/core/target.py) and
    wait for each one's first output (``wait_all=False``: so an error before any output still
    gets its HTTP status) or for its end. A failure, or the client leaving, aborts the
    others. Failures before the request runs are counted in the metrics."""
    plane = plane_of(request)
    watch = ClientWatch(request)
    streams: list[RequestStream] = []
    try:
        # one choice: awaited in place; several: submitted side by side
        tasks = [asyncio.ensure_future(c) for c in coros] if len(coros) > 1 else []
        try:
            if not tasks and coros:
                streams.append(await watch.run(coros[0]))
            for t in tasks:
                streams.append(await watch.run(t))
            for s in streams:
                await watch.run(s.wait_done() if wait_all else _first_output(s))
        except BaseException as exc:
            for t in tasks:
                t.cancel()
                if t.done() and not t.cancelled() and t.exception() is None and t.result() not in streams:
                    streams.append(t.result())
            for s in streams:
                s.abort()
            if watch.gone and isinstance(exc, asyncio.CancelledError):
                _left(plane, endpoint, streams)
                raise ClientDisconnected("the client closed the connection before the answer began") from None
            raise
    except CorralError as exc:
        if not (isinstance(exc, ClientDisconnected) and streams):  # those were counted each
            plane.metrics.observe_request(target.id, None, endpoint, exc.status)
        raise
    finally:
        watch.close()
    return streams


FIRST_OUTPUT_WAIT_S = 1.0  # a stream's headers wait this long for its first output, no longer


async def _first_output(s: RequestStream) -> None:
    """Until the stream's first output, so that an error before it still gets its HTTP
    status; but at most ``FIRST_OUTPUT_WAIT_S`` once a worker has it: a long prefill then
    goes on behind headers already sent (clients log a slow first byte, or give up), and an
    error after that comes in the stream, in the dialect's shape. Awaited in the request's
    own task (``asyncio.timeout``, not ``wait_for``'s task of its own): the first token
    wakes the handler directly, not a task that then wakes it two turns of the loop later,
    each turn behind every other stream's token of the same step."""
    try:
        async with asyncio.timeout(FIRST_OUTPUT_WAIT_S):
            await s.wait_started()
    except TimeoutError:
        return


def _left(plane: ControlPlane, endpoint: str, streams: list[RequestStream]) -> None:
    """The client left while its request queued, loaded or prefilled: 499, and the task that
    the watch cancelled runs on (to answer nobody) instead of ending in a traceback."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    for s in streams:
        observe(plane, s, endpoint, 499)
