"""Errors in the shape of the API a request came in on.

corral raises one exception tree (``corral.errors``); how an error looks on the wire
depends only on the route family, decided by the path:

    /api/...           Ollama      {"error": "message"}                         corral's status
    /v1/messages...    Anthropic   {"type": "error", "error": {"type", "message"}}
    anything else      OpenAI      {"error": {"message", "type", "param", "code"}}

Anthropic's error types follow its status codes (400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
429 rate_limit_error, 5xx api_error). "Try again later" (``Unavailable``: queue full, no
capacity within the wait, a model still downloading or just unloaded) is
``overloaded_error`` with status **529**, which is what Anthropic itself sends when it is
overloaded: Anthropic's SDKs and agents recognize exactly that (OverloadedError, retried
with backoff), while a 503 would only be a generic server error to them. The
``Retry-After`` header corral computes is sent as well; the SDKs honour it to time the
retry, and nothing in Anthropic's shape forbids it.

The app's exception handlers and the guard middleware both render through
``error_response`` so a 401 from the middleware looks like every other error of that API.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from starlette.responses import Response

from corral.errors import CorralError, Unavailable

__all__ = ["Dialect", "dialect_of", "error_body", "error_response", "ANTHROPIC_OVERLOADED_STATUS"]

Dialect = Literal["openai", "ollama", "anthropic"]
ANTHROPIC_OVERLOADED_STATUS = 529

_json = msgspec.json.Encoder()
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error"}


def dialect_of(path: str) -> Dialect:
    if path.startswith("/api/") or path == "/api":
        return "ollama"
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "openai"


def _anthropic(exc: CorralError) -> tuple[int, dict[str, Any]]:
    if isinstance(exc, Unavailable):
        status, etype = ANTHROPIC_OVERLOADED_STATUS, "overloaded_error"
    elif exc.status >= 500:
        status, etype = exc.status, "api_error"
    else:
        status, etype = exc.status, _ANTHROPIC_TYPES.get(exc.status, "invalid_request_error")
    return status, {"type": "error", "error": {"type": etype, "message": exc.message}}


def error_body(dialect: Dialect, exc: CorralError) -> tuple[int, dict[str, Any]]:
    """(status, body) of ``exc`` as ``dialect`` writes errors."""
    if dialect == "ollama":
        return exc.status, {"error": exc.message}
    if dialect == "anthropic":
        return _anthropic(exc)
    return exc.status, exc.to_body()


def error_response(path: str, exc: CorralError, headers: dict[str, str] | None = None) -> Response:
    """The HTTP response for ``exc`` on a request to ``path``."""
    status, body = error_body(dialect_of(path), exc)
    all_headers = {**exc.headers(), **(headers or {})}
    return Response(_json.encode(body), status_code=status, media_type="application/json",
                    headers=all_headers or None)
