"""The HTTP helpers every dialect uses: JSON, NDJSON and SSE bodies, the app's parts
(control plane, store, downloads), one reading of a validation error, and errors in the
shape of the API a request came in on.

Errors in the shape of the API a request came in on.

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

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from corral.errors import CorralError, InvalidRequest, Unavailable
from corral.store.confine import PathPolicy
from corral.control.created_models import CreatedModels
from corral.store.downloads import DownloadManager
from corral.store.llama_cache import llama_cache_dir
from corral.store.local import ModelStore

if TYPE_CHECKING:
    from fastapi import FastAPI

    from corral.control.plane import ControlPlane

__all__ = ["Dialect", "dialect_of", "error_body", "error_response", "ANTHROPIC_OVERLOADED_STATUS",
           "json_response", "ndjson_line", "sse_data", "sse_stream", "plane_of", "store_of", "downloads_of", "created_of",
           "invalid_request", "path_policy", "model_or_only", "InTaskStreamingResponse"]

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


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as a JSON body (msgspec)."""
    return Response(_json.encode(data), status_code=status, media_type="application/json",
                    headers=headers)


def ndjson_line(obj: Any) -> bytes:
    """One line of an NDJSON stream (Ollama's streamed answers)."""
    return _json.encode(obj) + b"\n"


def sse_data(data: Any) -> bytes:
    """One server-sent event carrying ``data`` as JSON (OpenAI's streams)."""
    return b"data: " + _json.encode(data) + b"\n\n"


class InTaskStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that streams in the request's own task. Starlette's (under
    uvicorn's ASGI 2.3) starts a task group per response and streams from a second task,
    so the first event of a stream goes out a turn of the event loop after the handler
    saw it, behind every other stream's event of the same worker step (at c=64, tens of
    them). Here a watcher reads the connection as Starlette's ``listen_for_disconnect``
    does, and the client's leaving cancels the streaming task (the events' generator ends
    as it did under the task group's cancel: its ``finally`` aborts the generation), after
    which the response ends quietly, as Starlette's does."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        gone = False

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        def on_gone(watcher: asyncio.Future[None]) -> None:
            nonlocal gone
            if not watcher.cancelled() and watcher.exception() is None:
                gone = True
                task.cancel("client disconnected")

        watcher = asyncio.ensure_future(disconnected())
        watcher.add_done_callback(on_gone)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
        finally:
            watcher.remove_done_callback(on_gone)
            watcher.cancel()
        if self.background is not None:
            await self.background()


def sse_stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    """A ``text/event-stream`` response of pre-encoded events (streamed in the request's task)."""
    return InTaskStreamingResponse(events, media_type="text/event-stream",
                                   headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def plane_of(request: Request) -> ControlPlane:
    """The control plane the app's lifespan created."""
    plane: ControlPlane = request.app.state.router
    return plane


def model_or_only(plane: ControlPlane, name: str | None) -> str:
    """The named model; with none named, the only one the request's key sees (else a 400:
    llama.cpp's routes and editor plugins may leave ``model`` out)."""
    if name:
        return name
    pools = plane.visible_pools()  # a key sees only its models (ids never leak)
    if len(pools) == 1:
        return pools[0].spec.id
    raise InvalidRequest("model: required field is missing (more than one model is configured; "
                         "GET /v1/models lists them)", param="model")


def store_of(request: Request) -> ModelStore | None:
    """The app's model store, or None (an app made with ``use_store=False``)."""
    store: ModelStore | None = getattr(request.app.state, "store", None)  # set by the app's lifespan
    return store


def created_of(request: Request) -> CreatedModels | None:
    """The models made by Ollama's create (kept in the state directory), or None (no store)."""
    created: CreatedModels | None = getattr(request.app.state, "created", None)  # likewise
    return created


def downloads_of(request: Request) -> DownloadManager | None:
    """The app's download manager, or None (an app made with ``use_store=False``)."""
    downloads: DownloadManager | None = getattr(request.app.state, "downloads", None)  # likewise
    return downloads


_HIDDEN_LOC = ("body", "query", "path")
_HIDDEN_LOC_PREFIXES = ("function-", "list[", "str", "union")


def invalid_request(errors: Sequence[Mapping[str, Any]]) -> InvalidRequest:
    """The one reading of a validation error (pydantic's error list, from a body, a query or a
    path): a 400 naming the first field at fault and what is wrong with it."""
    err: Mapping[str, Any] = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if err.get("type") == "json_invalid":
        ctx = err.get("ctx") or {}
        return InvalidRequest(f"the body is not valid JSON: {ctx.get('error', err.get('msg'))}")
    loc = [str(p) for p in err.get("loc", ())
           if p not in _HIDDEN_LOC and not str(p).startswith(_HIDDEN_LOC_PREFIXES)]
    if err.get("type") == "model_type" and not loc:
        return InvalidRequest("the body must be a JSON object")
    param = ".".join(loc) or None
    msg = str(err.get("msg"))
    return InvalidRequest(f"{param}: {msg}" if param else msg, param=param)


def path_policy(app: FastAPI) -> PathPolicy:
    """Which files requests may name now (see corral.store.confine): models_dir,
    [server] allowed_model_dirs, the HF cache, the config's model files, the embedded model."""
    plane: ControlPlane | None = getattr(app.state, "router", None)
    store = getattr(app.state, "store", None)
    if plane is None:
        return PathPolicy(store.root if store is not None else None)
    srv = plane.config.server
    files = [p.spec.path for p in plane.pools.values() if p.spec.source in ("config", "embedded")]
    files += [m.path for m in plane.config.models.values() if m.path is not None]
    root = store.root if store is not None else srv.models_dir
    cache = [llama_cache_dir()] if srv.llama_cache else []  # served in place, as the HF cache
    return PathPolicy(root, [*srv.allowed_model_dirs, *cache], files)
