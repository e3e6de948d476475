"""The guard's key checks: who is calling, may they call this route, and within their limits.

``authorize`` (called by corral.api.guard for every request) turns the presented secret
(``Authorization: Bearer``, ``x-api-key``) into the request's ``Caller`` through the
control plane's ``KeyRing``: 401 without a valid key, 403 ``insufficient_scope`` when
the key's scopes do not cover the route (corral.api.scopes). Without keys configured
every request is the anonymous caller ``-``.

``ModelRequest`` wraps the requests that reach a model (``MODEL_ROUTES``) of a key:

- ``priority`` (top-level body field, any dialect) above the key's ``max_priority``:
  400. Otherwise it is the ``Caller``'s priority, which orders the key's requests in
  the model's fair queue (corral.control.scheduling.fair_queue). The body of a POST is read here
  and replayed to the route unchanged;
- the key's rpm and whether tpm/tpd have tokens left (``Limiter.admit``; each worker
  request then reserves what it may use: corral.control.keys.access), then its concurrency and queue
  (``Limiter.enter``, released when the response is over, streams included): 429
  with Retry-After and x-ratelimit-* headers in the dialect's error shape;
- x-ratelimit-* headers on the response of a key with rpm or tpm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.http import error_response
from corral.api.scopes import MODEL_ROUTES, RouteScopes
from corral.control.keys.ring import ANONYMOUS, Caller
from corral.errors import AuthenticationError, InvalidRequest, RateLimited, ScopeDenied

if TYPE_CHECKING:
    from corral.control.keys.access import Access

__all__ = ["UNBOUNDED_PRIORITY", "ModelRequest", "authorize"]

UNBOUNDED_PRIORITY = 2**31 - 1
_json = msgspec.json.Decoder()


def authorize(access: Access, routes: RouteScopes, scope: Scope, presented: list[bytes],
              open_path: bool) -> tuple[Caller | None, bool]:
    """(the caller, whether the route reaches a model); raises 401/403. ``open_path``
    (health, the page): no key needed, None as caller when keys are configured."""
    method, path = scope["method"], scope["path"]
    keys = access.keys
    if open_path:
        return (None if keys.required else Caller(ANONYMOUS)), False
    template, needed = routes.scope_of(method, path)
    key = keys.authenticate(presented)
    if key is None:
        raise AuthenticationError("missing or wrong API key: send 'Authorization: Bearer KEY' or "
                                  "'x-api-key: KEY'")
    if needed in ("infer", "manage", "admin") and not key.allows(needed):
        raise ScopeDenied(f"key {key.name!r} lacks the {needed!r} scope that {method} {template} needs "
                          f"(its scopes: {', '.join(sorted(key.scopes)) or 'none'})")
    access.used(key.name)
    routed = "GET" if method == "HEAD" else method  # a HEAD runs the GET route
    return Caller(key), template is not None and (routed, template) in MODEL_ROUTES


def _priority(body: bytes, max_priority: int) -> int | InvalidRequest:
    """The body's ``priority`` (0 when absent), or why it is refused."""
    if b'"priority"' not in body:
        return 0
    try:
        doc = _json.decode(body)
    except msgspec.DecodeError:
        return 0  # the route says what is wrong with the body
    if not isinstance(doc, dict) or doc.get("priority") is None:
        return 0
    p = doc["priority"]
    if isinstance(p, bool) or not isinstance(p, int):
        return InvalidRequest("priority: must be an integer", param="priority")
    if p > max_priority:
        return InvalidRequest(f"priority: {p} is above this key's max_priority {max_priority}",
                              param="priority")
    return p


class ModelRequest:
    """One request of ``caller`` to a model route, as an ASGI app around the routes."""

    def __init__(self, app: ASGIApp, access: Access, caller: Caller, queue_timeout_s: float) -> None:
        self.app = app
        self.access = access
        self.caller = caller
        self.timeout = queue_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = self.caller.key
        spec = key.spec
        if scope["method"] == "POST":  # the priority, for the fair queue (checked against the bound)
            body, receive = await _buffered(receive)
            if body is None:
                return  # the client left (or the body was over the size limit: answered)
            priority = _priority(body, spec.max_priority)
            if isinstance(priority, InvalidRequest):
                await error_response(scope["path"], priority)(scope, receive, send)
                return
            self.caller.priority = priority
        if not key.limited:
            await self.app(scope, receive, send)
            return
        limiter = self.access.limiter
        try:
            limiter.admit(key.name, spec)
            await limiter.enter(key.name, spec, self.timeout)
        except RateLimited as exc:
            self.access.metrics.rate_limited.labels(key.name, exc.type).inc()
            self.access.rejected("-", 429)  # before a model was named: counted on the key alone
            await error_response(scope["path"], exc)(scope, receive, send)
            return
        headers = [(k.encode(), v.encode()) for k, v in limiter.headers(key.name, spec).items()]

        async def send_with_limits(msg: Message) -> None:
            if msg["type"] == "http.response.start" and headers:
                have = {k.lower() for k, _ in msg.get("headers", [])}  # a 429 of the route has its own
                msg = {**msg, "headers": [*msg.get("headers", []), *(h for h in headers if h[0] not in have)]}
            await send(msg)

        try:
            await self.app(scope, receive, send_with_limits)
        finally:
            limiter.leave(key.name, spec)


async def _buffered(receive: Receive) -> tuple[bytes | None, Receive]:
    """The whole body, and a receive that hands the route the same messages."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return None, receive
        messages.append(msg)
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            break

    async def replay() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return b"".join(chunks), replay

