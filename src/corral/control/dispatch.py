"""The request path: a request for a model already resolved goes to one of its workers.

The caller resolves the client's name once (``ControlPlane.pool``: id or alias, the key's
visibility) and hands the ``ModelPool`` down; nothing here resolves a name again. A request
makes sure the model is loaded (autoload through admission), takes a free slot or queues for
one, and is written to that worker; the ``RequestStream`` the API reads from is returned.
A loop that waited (a load, the queue) checks that the pool is still the model's
(``current``): a model removed meanwhile (catalog sync) is the 404 of a removed model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from corral import wire
from corral.config.file import ServerConfig
from corral.control.keys.access import Access
from corral.control.keys.limits import Reservation
from corral.control.placement.admission import Admission
from corral.control.request_frame import encode_request, input_param
from corral.control.scheduling.fair_queue import requester
from corral.control.scheduling.pool import ModelPool
from corral.control.stream import RequestStream
from corral.errors import CapacityTimeout, CorralError, LoadFailed, ModelNotFound, ModelNotLoaded, ModelUnloaded, RateLimited

if TYPE_CHECKING:
    from corral.control.transport.ray.cluster import RayCluster

__all__ = ["Dispatch"]

Msg = wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest


class Dispatch:
    def __init__(self, pools: dict[str, ModelPool], server: Callable[[], ServerConfig], access: Access,
                 admission: Admission, ray: RayCluster | None,
                 background: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]) -> None:
        self._pools = pools
        self._server = server
        self._access = access
        self._admission = admission
        self._ray = ray
        self._background = background
        self._live: set[RequestStream] = set()  # sent and not ended (``end_all``)
        self._ending: CorralError | None = None  # set by ``end_all``: what a request still arriving gets

    def current(self, pool: ModelPool) -> ModelPool:
        """``pool`` if it is still its model's; ModelNotFound when the model was removed (or
        removed and added again) while the request waited."""
        if self._ending is not None:
            raise self._ending
        if self._pools.get(pool.spec.id) is not pool:
            raise ModelNotFound(f"model {pool.spec.id!r} was removed", param="model")
        return pool

    def end_all(self, exc: CorralError) -> None:
        """The server is stopping: every request running or queued ends with ``exc`` (an
        answer in its API's shape, a stream its error event), and so does any later turn of
        a request's loop. The workers run on until the plane closes."""
        self._ending = exc
        for pool in self._pools.values():
            pool.fail_waiters(exc)
        for stream in list(self._live):
            stream.fail(exc)

    def _sent(self, stream: RequestStream) -> None:
        self._live.add(stream)
        stream.at_end(self._live.discard)  # added first: runs last

    async def tokenize(self, pool: ModelPool, msg: wire.TokenizeRequest, as_model: str | None = None) -> RequestStream:
        """Tokenize, detokenize or render a chat (``Tokenized``): no slot, no queue (the worker
        answers between decode steps); a model not loaded is loaded first. ``as_model``: as
        in ``submit``."""
        frame = encode_request(msg)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._server().queue_timeout_s  # the load's bound (no slot to wait for)
        asked = pool  # the model the request named: ``pool`` may become the one serving it
        while True:
            self.current(asked)
            ready = [i for i in pool.instances if i.accepting]
            if not ready:
                if pool.has_ready or loop.time() >= deadline:  # ready but its channel is closing: no wait
                    raise CapacityTimeout(f"model {pool.spec.id!r} is not available", retry_after_s=1)
                try:
                    pool = await self.ensure_loaded(pool)  # a variant: the model that serves it
                except ModelUnloaded:
                    pass
                continue
            inst = min(ready, key=pool.busy)
            stream = RequestStream(msg.id, as_model or asked.spec.id, input_param(msg))
            if inst.submit(msg.id, frame, stream, slotted=False):
                self._sent(stream)
                self._access.track(stream)
                return stream

    async def submit(self, pool: ModelPool, msg: Msg, prefix: str | None,
                     as_model: str | None = None) -> RequestStream:
        """``as_model``: the id the stream answers as, its metrics and usage (a variant's;
        None: ``pool``'s)."""
        frame = encode_request(msg)  # before a slot is taken: what cannot be sent takes none
        try:
            sent_msg, held = self._access.reserve(msg, pool)  # the key's tokens ahead (limits.py)
        except RateLimited:
            self._access.rejected(pool.spec.id, 429)
            raise
        try:
            return await self._send(pool, sent_msg, frame if sent_msg is msg else encode_request(sent_msg),
                                    prefix, held, as_model)
        except BaseException as exc:
            self._access.release(held)
            if isinstance(exc, CorralError) and exc.status in (429, 503):  # counted for the key's usage
                self._access.rejected(pool.spec.id, exc.status)
            raise

    async def _send(self, pool: ModelPool, msg: Msg, frame: bytes, prefix: str | None,
                    held: Reservation | None, as_model: str | None = None) -> RequestStream:
        loop = asyncio.get_running_loop()
        who = requester()  # whom the request is for: read once, passed to the queue and preemption
        bound = self._server().request_queue_timeout_s  # None: waits while its client does
        deadline = None if bound is None else loop.time() + bound
        asked = pool  # the model the request named: ``pool`` may become the one serving it (ensure_loaded)
        while True:
            stream = RequestStream(msg.id, as_model or self.current(asked).spec.id, input_param(msg))
            inst = pool.try_acquire(prefix, who)
            if inst is None:
                if not pool.has_ready and not pool.draining:
                    try:
                        pool = await self.ensure_loaded(pool)  # a variant: the model that serves it
                    except ModelUnloaded:  # another request unloaded it meanwhile: autoload again
                        if deadline is not None and loop.time() >= deadline:
                            raise
                        continue
                    inst = self.current(pool).try_acquire(prefix, who)
                if inst is None:
                    inst = await pool.wait_slot(prefix, who, max_queue=self._server().max_queue,
                                                deadline=deadline)
                    if inst is None:  # the model went away; start over
                        if deadline is not None and loop.time() >= deadline:
                            raise CapacityTimeout(f"model {pool.spec.id!r} is not available", retry_after_s=1)
                        continue
            sent = False
            try:
                sent = inst.submit(msg.id, frame, stream)
            finally:
                if not sent:  # it died just now, or the write failed: the slot goes back
                    pool.unreserve(inst, who)
            if sent:
                self._sent(stream)
                self._access.track(stream, held)  # its tokens count for the request's key when it ends
                pool.track(stream, who, inst if isinstance(msg, wire.GenerateRequest) else None)  # its fair share
                return stream

    async def ensure_loaded(self, pool: ModelPool) -> ModelPool:
        """``pool`` loaded (autoload), or the model whose instances serve it: a variant's
        first request while its host started loading (``Admission.load``); the request goes
        there."""
        if self._ray is not None:  # the Ray cluster lost: 503 at once, not a wait for instances
            err = self._ray.unreachable()
            if err is not None:
                raise err
        srv = self._server()
        if pool.occupies:
            waiting = pool.wait_ready(srv.load_timeout_s)
            await (waiting if self._ray is None else self._ray.while_reachable(waiting))
            return pool
        if pool.failed_final:
            if pool.retry_due:  # a crash loop's backoff has passed: try again
                return await self._admission.load(pool, fresh=False)
            raise LoadFailed(f"model {pool.spec.id!r} failed: {pool.failure_reason}; "
                             "POST /models/load to try again")
        if not srv.autoload:
            raise ModelNotLoaded(f"model {pool.spec.id!r} is not loaded and autoload is off; "
                                 "load it with POST /models/load", param="model")
        return await self._admission.load(pool)

    def keep_alive(self, pool: ModelPool, seconds: float | None) -> None:
        """Ollama's ``keep_alive``, applied when a request ends: None leaves the model's
        configured ttl_s; 0 unloads it as soon as it is idle; > 0 unloads it after that
        many idle seconds; < 0 keeps it loaded (never evicted) until it is unloaded.
        Nothing for a model removed meanwhile."""
        if seconds is None or self._pools.get(pool.spec.id) is not pool or not pool.occupies or pool.spec.pinned:
            return  # a model pinned in the config stays loaded whatever a request asks
        pool.keep_alive_s = seconds
        if seconds == 0:
            self._background(self._admission.unload_idle(pool, "keep_alive=0"), f"keep_alive {pool.spec.id}")
