"""Access: the keys, their limits and their usage, as one part of the control plane.

``ControlPlane.access`` bundles the ``KeyRing`` (corral.control.keys), the ``Limiter``
(corral.control.limits) and the ``UsageBook`` (corral.control.usage). The guard
(corral.api.guard) authenticates through it and sets the request's ``Caller``; the
plane calls ``visible`` when it resolves a model name (a model the key may not use is
"not found", in every dialect and list) and ``track`` on every worker request it sends:
when that request ends, its tokens are counted (usage, metrics, the key's tpm/tpd).

Usage is counted per (key, model, UTC day): one request per HTTP request and model
(the choices of ``n > 1`` are one request), prompt and completion tokens of every
worker request. Without keys configured the key is ``-`` (anonymous); the ``[server]
api_key`` is ``api_key``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from corral.config import CorralConfig
from corral.control.keys import CALLER, Caller, KeyRing
from corral.control.limits import Limiter
from corral.control.metrics import Metrics
from corral.control.usage import UsageBook, state_dir
from corral.errors import ModelNotFound
from corral.events import EventBus

if TYPE_CHECKING:
    from corral.control.catalog import ModelSpec
    from corral.control.pool import ModelPool
    from corral.control.stream import RequestStream

__all__ = ["Access"]

log = logging.getLogger("corral.access")


class Access:
    def __init__(self, config: CorralConfig, bus: EventBus, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.keys = KeyRing(lambda: self.config.server.keys_file, lambda: self.config.server.api_key, bus)
        self.usage = UsageBook(state_dir(config.server.state_dir))
        self.limiter = Limiter(day_tokens=self.usage.day_tokens)

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

    def track(self, stream: RequestStream) -> None:
        """Count ``stream`` for the current request's key when it ends."""
        caller = CALLER.get()
        if caller is None:
            return
        first = stream.model not in caller.counted
        caller.counted.add(stream.model)
        stream.on_finish = lambda s: self._finished(caller, s, first)

    def _finished(self, caller: Caller, stream: RequestStream, first: bool) -> None:
        try:  # called by the worker link's reader: nothing may escape into it
            self._count(caller, stream, first)
        except Exception:
            log.exception("counting the usage of request %s failed", stream.id)

    def _count(self, caller: Caller, stream: RequestStream, first: bool) -> None:
        prompt, completion = _tokens(stream)
        key, model = caller.name, stream.model
        self.usage.record(key, model, requests=int(first), prompt_tokens=prompt, completion_tokens=completion)
        if first:
            self.metrics.key_requests.labels(key, model).inc()
        if prompt:
            self.metrics.key_prompt_tokens.labels(key, model).inc(prompt)
        if completion:
            self.metrics.key_completion_tokens.labels(key, model).inc(completion)
        if caller.key.limited:
            self.limiter.charge(key, caller.key.spec, prompt + completion)


def _tokens(stream: RequestStream) -> tuple[int, int]:
    """(prompt, completion) tokens of an ended worker request."""
    if stream.finished is not None:
        return stream.finished.usage.prompt_tokens, stream.finished.usage.completion_tokens
    if stream.embeddings is not None:
        return stream.embeddings.prompt_tokens, 0
    return 0, stream.n_tokens  # failed or aborted: what was generated
