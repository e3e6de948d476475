"""The guard in front of every route: what a request must be before any route sees it.

A pure ASGI middleware (not BaseHTTPMiddleware: it must not buffer streams). In order:

1. **Host** (DNS rebinding): the ``Host`` header must be an IP literal, ``localhost``
   (or ``*.localhost``), the configured ``[server] host``, this machine's name or a name
   in ``[server] allowed_hosts`` ("*" accepts any). A page on ``evil.example`` whose
   name was re-pointed at 127.0.0.1 sends ``Host: evil.example``: 403.
2. **Origin** (cross-site requests from browsers): a request that carries ``Origin`` must
   come from the server's own origin or one in ``[server] allowed_origins`` (glob
   patterns, e.g. ``http://localhost:*``; like Ollama's OLLAMA_ORIGINS), else 403. CORS
   preflights (OPTIONS) are answered for those origins only, and their responses carry
   ``Access-Control-Allow-Origin``.
3. **Keys** (when ``[server] api_key`` or ``[server] keys_file`` is set): every route but
   ``GET /health`` and the web page's static files (``GET /``, ``GET /ui/{asset}``: they
   hold no data; the page asks for the key itself), docs, schema, metrics and the event
   stream included. ``Authorization: Bearer KEY`` or ``x-api-key: KEY`` (Anthropic's
   clients). Compared in constant time (SHA-256 digests, so not even the length leaks).
   The key's scopes must cover the route (``corral.api.scopes``: 403 otherwise); the
   request runs with its ``Caller`` set (``corral.control.keys.ring.CALLER``), and requests to
   a model go through the key's priority bound and limits (``corral.api.access``).
   Refusals use the error shape of the API the path belongs to (``corral.api.http``).
4. **Content-Type**: a body sent as ``text/plain``, ``application/x-www-form-urlencoded``
   or ``multipart/form-data`` is refused (415): those are the types a browser may send
   cross-site without a preflight. Any other type, or none, is read as JSON (every route
   that takes a body takes JSON), as Ollama does: LiteLLM's ``ollama/`` providers send
   JSON with no Content-Type, or ``application/octet-stream``. The one exception is
   ``FORM_PATHS``, OpenAI's speech-to-text routes, whose body is OpenAI's multipart form:
   there ``multipart/form-data`` is the type (a cross-site page is still refused by step 2
   when it sends an Origin, and by step 3 where keys are configured).
5. **Overload**: while the router's loop lags more than ``[server] shed_lag_s``
   (``corral.api.overload``), a request to a model is answered 503 with ``Retry-After``
   before its body is read.
6. **Body size**: ``Content-Length`` over ``max_body_bytes`` -> 413 at once; a chunked
   body is counted as it streams in. Over the limit before the response started: 413;
   after (a stream already running): the request ends as if the client had left. On
   ``FORM_PATHS`` the bound is ``max_audio_bytes_per_request`` and 1 MiB for the fields,
   when that is more.

Routes must also never change state on GET/HEAD (no preflight protects those).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.access import ModelRequest, authorize
from corral.api.http import error_response
from corral.api.scopes import RouteScopes
from corral.config.file import ServerConfig
from corral.control.keys.access import Access
from corral.control.keys.ring import CALLER, Caller
from corral.api.page.routes import is_public_path
from corral.api.overload import LoadMonitor
from corral.errors import (AuthenticationError, CorralError, HostNotAllowed, OriginNotAllowed,
                           PayloadTooLarge, Unavailable, UnsupportedMediaType)

__all__ = ["FORM_PATHS", "GuardMiddleware", "host_allowed", "key_matches"]

_OPEN_PATHS = frozenset({"/health"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_CORS_METHODS = "GET, POST, DELETE, OPTIONS"
_THIS_HOST = socket.gethostname().lower()
_EXPOSED = b", ".join([b"Retry-After"] + [f"x-ratelimit-{w}-{k}".encode() for k in ("requests", "tokens")
                                          for w in ("limit", "remaining", "reset")])


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def key_matches(presented: bytes, key: str) -> bool:
    """Constant time in the content and the length of both."""
    return hmac.compare_digest(hashlib.sha256(presented).digest(),
                               hashlib.sha256(key.encode()).digest())


def _presented_keys(scope: Scope) -> list[bytes]:
    """``Authorization: Bearer KEY`` and ``x-api-key: KEY`` (what Anthropic's clients send)."""
    keys = []
    auth = _header(scope, b"authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(b" ")
        if scheme.lower() == b"bearer":
            keys.append(token.strip())
    x_api_key = _header(scope, b"x-api-key")
    if x_api_key is not None:
        keys.append(x_api_key.strip())
    return keys


def _host_name(host_header: str) -> str:
    """``[::1]:8080`` -> ``::1``; ``Example.COM.:80`` -> ``example.com``."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def host_allowed(host_header: str, bound_host: str, allowed: list[str]) -> bool:
    name = _host_name(host_header)
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True  # rebinding needs a name; an IP literal is the address itself
    except ValueError:
        pass
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if name in (bound_host.lower(), _THIS_HOST):
        return True
    return any(fnmatch.fnmatchcase(name, pat.lower()) for pat in allowed)


def _origin_allowed(origin: str, host_header: str | None, allowed: list[str]) -> bool:
    if any(fnmatch.fnmatchcase(origin.lower(), pat.lower()) for pat in allowed):
        return True
    if origin == "null" or host_header is None:
        return False
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host_header.strip().lower()


def _open_path(scope: Scope) -> bool:
    """Served without the API key: /health and the page's static files."""
    path = scope["path"]
    return path in _OPEN_PATHS or (scope["method"] in ("GET", "HEAD") and is_public_path(path))


FORM_PATHS = frozenset({"/v1/audio/transcriptions", "/audio/transcriptions", "/v1/audio/translations",
                        "/audio/translations"})
_SIMPLE_TYPES = frozenset({b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data"})


def _cross_site_type(content_type: bytes | None) -> bool:
    """Whether a body's type is one a browser sends cross-site without a CORS preflight."""
    if content_type is None:
        return False
    return content_type.split(b";", 1)[0].strip().lower() in _SIMPLE_TYPES


class GuardMiddleware:
    def __init__(self, app: ASGIApp, get_server: Callable[[], ServerConfig],
                 get_access: Callable[[], Access | None] | None = None,
                 routes: RouteScopes | Callable[[], RouteScopes] | None = None,
                 get_load: Callable[[], LoadMonitor | None] | None = None) -> None:
        """``get_access``: the control plane's ``Access`` (None before it exists: only
        ``[server] api_key`` is checked); ``routes``: the app's routes and their scopes;
        ``get_load``: the router's load monitor (None: nothing is shed)."""
        self.app = app
        self.get_server = get_server
        self.get_access = get_access or (lambda: None)
        self.get_load = get_load or (lambda: None)
        self._routes = routes

    @property
    def routes(self) -> RouteScopes:
        if callable(self._routes):
            self._routes = self._routes()  # the app's routes, compiled on the first request
        return self._routes if self._routes is not None else RouteScopes([])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        srv = self.get_server()
        caller: Caller | None = None
        refusal, cors_origin = self._check(scope, srv)
        model_route = False
        if refusal is None:
            try:
                caller, model_route = self._authorize(scope, srv)
                refusal = self._media_refusal(scope)
                load = self.get_load()
                if refusal is None and model_route and load is not None and load.overloaded(srv.shed_lag_s):
                    refusal = Unavailable("the server is overloaded; try again shortly", retry_after_s=1)
            except CorralError as exc:
                refusal = exc
        if refusal is not None:
            resp = error_response(scope["path"], refusal)
            if isinstance(refusal, AuthenticationError):
                resp.headers["WWW-Authenticate"] = "Bearer"
            await resp(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and cors_origin is not None \
                and _header(scope, b"access-control-request-method") is not None:
            await self._preflight(scope, receive, send, cors_origin)
            return
        app = self.app
        access = self.get_access()
        if caller is not None and model_route and access is not None:
            app = ModelRequest(self.app, access, caller, srv.queue_timeout_s)
        token = CALLER.set(caller)
        limit = srv.max_body_bytes
        if scope["path"] in FORM_PATHS:  # recordings in OpenAI's multipart form
            limit = max(limit, srv.max_audio_bytes_per_request + 1024 * 1024)
        elif scope["method"] == "POST" and str(scope.get("path", "")).startswith("/api/blobs/"):
            limit = srv.max_upload_bytes  # an upload for Ollama's create: a model file
        try:
            await self._guarded(scope, receive, send, limit, cors_origin, app)
        finally:
            CALLER.reset(token)

    def _authorize(self, scope: Scope, srv: ServerConfig) -> tuple[Caller | None, bool]:
        """The request's caller and whether it reaches a model; raises 401/403."""
        preflight = scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None
        access = self.get_access()
        if access is None:  # before the plane exists: the single api_key, as it always was
            key = srv.api_key
            if key and not preflight and not _open_path(scope) \
                    and not any([key_matches(k, key) for k in _presented_keys(scope)]):  # every key compared
                raise AuthenticationError(
                    "missing or wrong API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
            return None, False
        return authorize(access, self.routes, scope, _presented_keys(scope), preflight or _open_path(scope))

    def _check(self, scope: Scope, srv: ServerConfig) -> tuple[CorralError | None, str | None]:
        """The refusal (or None) and the allowed cross-origin caller (or None)."""
        raw_host = _header(scope, b"host")
        host = raw_host.decode("latin-1") if raw_host is not None else None
        if host is not None and not host_allowed(host, srv.host, list(srv.allowed_hosts)):
            return HostNotAllowed(f"host {host!r} is not served here (DNS rebinding protection); "
                                  "add the name to [server] allowed_hosts to allow it"), None
        cors_origin = None
        raw_origin = _header(scope, b"origin")
        if raw_origin is not None:
            origin = raw_origin.decode("latin-1")
            if not _origin_allowed(origin, host, list(srv.allowed_origins)):
                return OriginNotAllowed(f"origin {origin!r} is not allowed to call this server; add "
                                        "it to [server] allowed_origins to allow it"), None
            cors_origin = origin
        return None, cors_origin

    def _media_refusal(self, scope: Scope) -> CorralError | None:
        content_type = _header(scope, b"content-type")
        if scope["path"] in FORM_PATHS and content_type is not None \
                and content_type.split(b";", 1)[0].strip().lower() == b"multipart/form-data":
            return None
        if scope["method"] in _BODY_METHODS and self._has_body(scope) \
                and _cross_site_type(content_type):
            return UnsupportedMediaType(
                "the request body must be JSON, not a text/plain or form body (a browser sends those "
                "cross-site without asking); send 'Content-Type: application/json' "
                "(curl: -H 'Content-Type: application/json')")
        return None

    @staticmethod
    def _has_body(scope: Scope) -> bool:
        if _header(scope, b"transfer-encoding") is not None:
            return True
        length = _header(scope, b"content-length")
        return length is not None and length.strip() not in (b"", b"0")

    async def _preflight(self, scope: Scope, receive: Receive, send: Send, origin: str) -> None:
        asked = _header(scope, b"access-control-request-headers") or b""
        headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                   "Access-Control-Allow-Methods": _CORS_METHODS,
                   "Access-Control-Allow-Headers": asked.decode("latin-1"),
                   "Access-Control-Max-Age": "600"}
        await Response(status_code=204, headers=headers)(scope, receive, send)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, limit: int,
                       cors_origin: str | None, app: ASGIApp) -> None:
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                declared = 0
            if declared > limit:
                await error_response(scope["path"], PayloadTooLarge(
                    f"request body of {declared} bytes exceeds max_body_bytes={limit}"))(scope, receive, send)
                return
        seen = 0
        started = False
        refused = False

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if refused:
                return
            if msg["type"] == "http.response.start":
                started = True
                if cors_origin is not None:
                    msg = {**msg, "headers": [*msg.get("headers", []),
                                              (b"access-control-allow-origin", cors_origin.encode("latin-1")),
                                              (b"vary", b"Origin"),
                                              (b"access-control-expose-headers", _EXPOSED)]}
            await send(msg)

        async def limited_receive() -> Message:
            nonlocal seen, refused, started
            if refused:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    if not started:
                        started = True
                        await error_response(scope["path"], PayloadTooLarge(
                            f"request body exceeds max_body_bytes={limit}"))(scope, receive, send)
                    refused = True
                    return {"type": "http.disconnect"}
            return msg

        try:
            await app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise
            # the route saw the body end early (ClientDisconnect); the 413 already went out
