"""The FastAPI application: state, middleware, error mapping, routes.

``create_app(config)`` builds the app; its lifespan creates the EventBus, the
ModelStore, the ControlPlane (``app.state.router``) and the DownloadManager, and
stops every worker on shutdown. Errors: one handler maps every ``CorralError`` with
``to_body()``/``status``/``headers()``; validation errors become 400 naming the field
(never 422); unknown routes 404; anything else 500 with no traceback in the body.

A small ASGI middleware (not BaseHTTPMiddleware: it must not buffer streams) checks
the API key (every route but /health) and the body size (413).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api import management_routes, openai_routes
from corral.config import CorralConfig
from corral.control.events import EventBus
from corral.control.metrics import Metrics
from corral.control.plane import ControlPlane
from corral.errors import AuthenticationError, CorralError, PayloadTooLarge

__all__ = ["create_app"]

log = logging.getLogger("corral.api")
_json = msgspec.json.Encoder()


def _error_response(exc: CorralError) -> Response:
    return Response(_json.encode(exc.to_body()), status_code=exc.status,
                    media_type="application/json", headers=exc.headers())


class GuardMiddleware:
    """API key (Bearer) on every route but /health; request bodies over the limit: 413."""

    def __init__(self, app: ASGIApp, get_server: Callable[[], Any]) -> None:
        self.app = app
        self.get_server = get_server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        srv = self.get_server()
        if srv is None:
            await self.app(scope, receive, send)
            return
        key = srv.api_key
        if key and scope["path"] != "/health":
            got = b""
            for name, value in scope["headers"]:
                if name == b"authorization":
                    got = value
                    break
            if not hmac.compare_digest(got, b"Bearer " + key.encode()):
                err = AuthenticationError("missing or wrong API key: send 'Authorization: Bearer KEY'")
                resp = _error_response(err)
                resp.headers["WWW-Authenticate"] = "Bearer"
                await resp(scope, receive, send)
                return
        limit = srv.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await _error_response(PayloadTooLarge(
                        f"request body of {int(value)} bytes exceeds max_body_bytes={limit}"))(scope, receive, send)
                    return
                break
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(f"request body exceeds max_body_bytes={limit}")
            return msg

        await self.app(scope, limited_receive, send)


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> Response:
        if exc.status >= 500:
            log.warning("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        err = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        from corral.errors import InvalidRequest
        return _error_response(InvalidRequest(f"{param}: {err.get('msg')}" if param else str(err.get("msg")),
                                              param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        body = {"error": {"message": f"{request.method} {request.url.path}: {exc.detail}",
                          "type": "invalid_request_error" if exc.status_code < 500 else "server_error",
                          "param": None, "code": code}}
        return Response(_json.encode(body), status_code=exc.status_code, media_type="application/json",
                        headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        body = {"error": {"message": "internal server error (see the server log)",
                          "type": "server_error", "param": None, "code": "internal_error"}}
        return Response(_json.encode(body), status_code=500, media_type="application/json")


def _embedded() -> tuple[str, Path, tuple[str, ...]] | None:
    try:
        from corral.store.embedded import (EMBEDDED_MODEL_ALIASES, EMBEDDED_MODEL_ID,
                                           embedded_model_path)
        return EMBEDDED_MODEL_ID, embedded_model_path(), tuple(EMBEDDED_MODEL_ALIASES)
    except Exception as exc:  # the package is missing or broken: serve without it
        log.warning("embedded default model unavailable: %s", exc)
        return None


def _store(config: CorralConfig) -> Any:
    try:
        from corral.store.local import ModelStore, default_models_dir
    except ImportError:
        return None
    return ModelStore(config.server.models_dir or default_models_dir())


def create_app(config: CorralConfig, *, config_loader: Callable[[], CorralConfig] | None = None,
               embedded: bool | tuple[str, Path, tuple[str, ...]] | None = True,
               use_store: bool = True, handle_sighup: bool = False) -> FastAPI:
    """The router app. ``embedded=True`` serves the embedded default model (unless the
    config turns it off); ``use_store`` lists models_dir; ``handle_sighup`` reloads on SIGHUP."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        bus = EventBus()
        metrics = Metrics()
        store = _store(config) if use_store else None
        emb = _embedded() if embedded is True else (embedded or None)
        plane = ControlPlane(config, bus=bus, metrics=metrics, store=store,
                             config_loader=config_loader, embedded=emb)
        downloads = None
        if store is not None:
            try:
                from corral.control.downloads import DownloadManager
                downloads = DownloadManager(store, bus, on_finished=plane.on_download_finished)
            except ImportError:
                downloads = None
        app.state.router = plane
        app.state.bus = bus
        app.state.store = store
        app.state.downloads = downloads
        app.state.metrics = metrics
        await plane.start()
        loop = asyncio.get_running_loop()
        if handle_sighup:
            loop.add_signal_handler(signal.SIGHUP, plane.reload_soon, "SIGHUP")
        try:
            yield
        finally:
            if handle_sighup:
                loop.remove_signal_handler(signal.SIGHUP)
            if downloads is not None:
                with contextlib.suppress(Exception):
                    await downloads.close()
            await plane.close()

    app = FastAPI(title="corral", version="0.1.0", lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    _install_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(management_routes.router)
    try:
        from corral.api.store_routes import router as store_router
        app.include_router(store_router)
    except ImportError as exc:
        log.warning("store routes unavailable: %s", exc)

    def server() -> Any:
        plane = getattr(app.state, "router", None)
        return plane.config.server if plane is not None else config.server

    app.add_middleware(GuardMiddleware, get_server=server)
    return app
