"""Access: the keys, their limits and their usage, as one part of the control plane.

``ControlPlane.access`` bundles the ``KeyRing`` (corral.control.keys.ring), the ``Limiter``
(corral.control.keys.limits) and the ``UsageBook`` (corral.control.keys.usage). The guard
(corral.api.guard) authenticates through it and sets the request's ``Caller``; the
plane calls ``visible`` when it resolves a model name (a model the key may not use is
"not found", in every dialect and list), ``reserve`` before it sends a worker request
(the tokens it may use, taken from the key's tpm/tpd: ``token_need``) and ``track`` once
it is sent: when that request ends, its tokens are counted (usage, metrics) and the
reservation settled (what it did not use goes back to the key).

Usage is counted per (key, model, UTC day): one request per HTTP request and model
(the choices of ``n > 1`` are one request), prompt and completion tokens of every
worker request. Without keys configured the key is ``-`` (anonymous); the ``[server]
api_key`` is ``api_key``.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import msgspec

from corral import wire
from corral.config.file import CorralConfig
from corral.control.keys.ring import CALLER, Caller, KeyRing
from corral.control.keys.limits import Limiter, Reservation
from corral.control.metrics import Metrics
from corral.control.keys.usage import UsageBook, state_dir
from corral.errors import ModelNotFound, RateLimited
from corral.events import EventBus

if TYPE_CHECKING:
    from corral.control.catalog import ModelSpec
    from corral.control.scheduling.pool import ModelPool
    from corral.control.stream import RequestStream

__all__ = ["Access", "token_need"]

log = logging.getLogger("corral.access")

Msg = wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest
_TEMPLATE_ROOM = 64  # what a chat template may add beyond the messages (BOS, a default system turn)


def token_need(msg: Msg, n_ctx_slot: int) -> int:
    """The most prompt + completion tokens ``msg`` may use, known before a worker tokenizes
    it. A token is at least one byte of text, so the encoded request bounds its prompt;
    images (their tokens depend on the model) and no max_tokens: the slot's context."""
    if isinstance(msg, wire.TokenizeRequest):
        return 0  # counts no tokens
    if isinstance(msg, wire.EmbedRequest):
        extra = len(msg.query.encode()) + 8 if msg.query is not None else 8
        return sum(len(t.encode()) + extra for t in msg.inputs)
    max_tokens = msg.params.max_tokens
    if max_tokens is None or msg.images or any(m.images for m in msg.messages or ()):
        return n_ctx_slot
    prompt = len(msg.prompt_tokens) + 1 if msg.prompt_tokens is not None else len(wire.encode(msg)) + _TEMPLATE_ROOM
    return min(n_ctx_slot, prompt + max_tokens)


class Access:
    def __init__(self, config: CorralConfig, bus: EventBus, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.keys = KeyRing(lambda: self.config.server.keys_file, lambda: self.config.server.api_key, bus)
        self.usage = UsageBook(state_dir(config.server.state_dir))
        self.limiter = Limiter(day_tokens=self.usage.day_tokens)
        self.last_used: dict[str, float] = {}  # key name -> when its last request was admitted (epoch s)

    def reconfigure(self, config: CorralConfig) -> None:
        """A reloaded config: the keys file (maybe another one) is read again."""
        self.config = config
        self.keys.reload("config reloaded")

    def close(self) -> None:
        self.usage.close()

    # ------------------------------------------------------------------ the plane's hooks

    @staticmethod
    def visible(spec: ModelSpec) -> bool:
        """Whether the current request's key may use (and see) this model."""
        caller = CALLER.get()
        return caller is None or caller.key.sees(spec.id, spec.aliases)

    def check_visible(self, name: str, pool: ModelPool | None) -> None:
        """ModelNotFound, word for word what an unknown name gets (no id leaks), when the
        request's key may not use the model ``name`` resolved to."""
        if pool is not None and not self.visible(pool.spec):
            raise ModelNotFound(f"model {name!r} not found; GET /v1/models lists the models", param="model")

    @staticmethod
    def visible_id(model_id: str) -> bool:
        """Like ``visible``, for a model known by its id alone (a download in progress)."""
        caller = CALLER.get()
        return caller is None or caller.key.sees(model_id)

    def reserve(self, msg: Msg, pool: ModelPool) -> tuple[Msg, Reservation | None]:
        """Take the tokens ``msg`` may use from the current key's tpm/tpd (RateLimited when
        none are left): a generation runs within what it got (``token_budget``, enforced by
        the worker), embeddings need all of theirs. None: nothing to hold."""
        caller = CALLER.get()
        if caller is None or (caller.key.spec.tpm is None and caller.key.spec.tpd is None):
            return msg, None
        want = token_need(msg, _slot_context(pool))
        if want <= 0:
            return msg, None
        try:
            held = self.limiter.reserve(caller.name, caller.key.spec, want)
        except RateLimited as exc:
            self.metrics.rate_limited.labels(caller.name, exc.type).inc()
            raise
        if isinstance(msg, wire.GenerateRequest):
            return msgspec.structs.replace(msg, token_budget=held.tokens), held
        if held.tokens < want:
            self.limiter.settle(held, 0)
            self.metrics.rate_limited.labels(caller.name, "tokens").inc()
            raise RateLimited(f"key {caller.name!r} has {held.tokens} tokens left of its token limits "
                              f"(tpm/tpd); these inputs may need {want}", retry_after_s=60.0, kind="tokens")
        return msg, held

    def release(self, held: Reservation | None) -> None:
        """A reservation whose request was never sent."""
        if held is not None:
            self.limiter.settle(held, 0)

    def track(self, stream: RequestStream, held: Reservation | None = None) -> None:
        """Count ``stream`` for the current request's key when it ends (and settle ``held``)."""
        caller = CALLER.get()
        if caller is None:
            self.release(held)
            return
        first = stream.model not in caller.counted
        caller.counted.add(stream.model)
        stream.at_end(lambda s: self._finished(caller, s, first, held))

    def _finished(self, caller: Caller, stream: RequestStream, first: bool, held: Reservation | None) -> None:
        try:  # called by the worker link's reader: nothing may escape into it
            self._count(caller, stream, first, held)
        except Exception:
            log.exception("counting the usage of request %s failed", stream.id)

    def used(self, name: str) -> None:
        """The key ``name`` was just let in (the guard, for GET /keys' ``last_used``). Names
        from the keys file, "api_key", "-": bounded by the file."""
        self.last_used[name] = time.time()

    def rejected(self, model: str, status: int) -> None:
        """The current key's request was answered 429 (its limits) or 503 (no room, the
        queue full); ``model``: "-" when it was refused before a model was named."""
        caller = CALLER.get()
        if caller is None:
            return
        if status == 429:
            self.usage.record(caller.name, model, limited=1)
        else:
            self.usage.record(caller.name, model, unavailable=1)
            self.metrics.key_unavailable.labels(caller.name, model).inc()

    def _count(self, caller: Caller, stream: RequestStream, first: bool, held: Reservation | None) -> None:
        prompt, completion = _tokens(stream)
        key, model = caller.name, stream.model
        cached = stream.finished.usage.cached_tokens if stream.finished is not None else 0
        queue_s = _queue_s(stream)
        self.usage.record(key, model, requests=int(first), prompt_tokens=prompt, completion_tokens=completion,
                          cached_tokens=cached, queue_ms=round(queue_s * 1000))
        if cached:
            self.metrics.key_cached_tokens.labels(key, model).inc(cached)
        if queue_s > 0:
            self.metrics.key_queue_seconds.labels(key, model).inc(queue_s)
        if first:
            self.metrics.key_requests.labels(key, model).inc()
        if prompt:
            self.metrics.key_prompt_tokens.labels(key, model).inc(prompt)
        if completion:
            self.metrics.key_completion_tokens.labels(key, model).inc(completion)
        if held is not None:
            self.limiter.settle(held, prompt + completion)


def _queue_s(stream: RequestStream) -> float:
    """How long a worker request waited for a slot: in the router's queue (created until handed
    to a worker) and in the worker's (its timings)."""
    router = (stream.started - stream.created) if stream.started is not None else 0.0
    worker = stream.finished.timings.queued_ms / 1000 if stream.finished is not None else 0.0
    return max(0.0, router) + max(0.0, worker)


def _tokens(stream: RequestStream) -> tuple[int, int]:
    """(prompt, completion) tokens of an ended worker request."""
    if stream.finished is not None:
        return stream.finished.usage.prompt_tokens, stream.finished.usage.completion_tokens
    if stream.embeddings is not None:
        return stream.embeddings.prompt_tokens, 0
    return 0, stream.n_tokens  # failed or aborted: what was generated


def _slot_context(pool: ModelPool) -> int:
    """A slot's context in tokens: as a loaded instance reports it, else as configured."""
    loaded = next((i.info.n_ctx_slot for i in pool.instances if i.info is not None), None)
    return int(loaded) if loaded is not None else pool.spec.slot_ctx()
