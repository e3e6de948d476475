"""The FastAPI application: state, middleware, error mapping, routes.

``create_app(config)`` builds the app; its lifespan creates the EventBus, the
ModelStore, the ControlPlane (``app.state.router``) and the DownloadManager, and
stops every worker on shutdown. Errors: one handler maps every ``CorralError`` with
``to_body()``/``status``/``headers()``; validation errors become 400 naming the field
(never 422); unknown routes 404; anything else 500 with no traceback in the body.

``corral.api.guard.GuardMiddleware`` runs before every route: Host and Origin checks,
CORS for ``allowed_origins``, the API key (every route but /health), JSON content type
and body size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from corral.api import (anthropic_routes, live_stats, management_routes, ollama_models,
                        ollama_routes, openai_routes, page_routes, responses_routes,
                        tokenize_routes)
from corral.api.guard import GuardMiddleware, error_response
from corral.api.hot_routes import HotRoutes
from corral.api.openapi_doc import document_request_bodies
from corral.config import CorralConfig
from corral.events import EventBus
from corral.control.metrics import Metrics
from corral.control.plane import ControlPlane
from corral.errors import CorralError, InternalError, error_for_status
from corral.store.confine import PathPolicy

__all__ = ["create_app"]

log = logging.getLogger("corral.api")


def _error_response(exc: CorralError, path: str) -> Response:
    """``exc`` in the error shape of the API ``path`` belongs to (OpenAI, Ollama, Anthropic)."""
    return error_response(exc, path)


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> Response:
        if exc.status >= 500:
            log.warning("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
        return _error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        err = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        param = ".".join(loc) or None
        from corral.errors import InvalidRequest
        return _error_response(InvalidRequest(f"{param}: {err.get('msg')}" if param else str(err.get("msg")),
                                              param=param), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        err = error_for_status(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        resp = _error_response(err, request.url.path)
        resp.headers.update(getattr(exc, "headers", None) or {})
        return resp

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error_response(InternalError("internal server error (see the server log)"),
                               request.url.path)


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


def path_policy(app: FastAPI) -> PathPolicy:
    """Which files requests may name now (see corral.store.confine): models_dir,
    [server] allowed_model_dirs, the HF cache, the config's model files, the embedded model."""
    plane: ControlPlane | None = getattr(app.state, "router", None)
    store = getattr(app.state, "store", None)
    if plane is None:
        return PathPolicy(store.root if store is not None else None)
    srv = plane.config.server
    files = [p.spec.path for p in plane.pools.values() if p.spec.source in ("config", "embedded")]
    files += [m.path for m in plane.config.models.values()]
    root = store.root if store is not None else srv.models_dir
    return PathPolicy(root, srv.allowed_model_dirs, files)


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
        if store is not None:
            store.may_serve = lambda path: path_policy(app).allows(path)
        emb = _embedded() if embedded is True else (embedded or None)
        plane = ControlPlane(config, bus=bus, metrics=metrics, store=store,
                             config_loader=config_loader, embedded=emb)
        downloads = None
        if store is not None:
            try:
                from corral.store.downloads import DownloadManager
                downloads = DownloadManager(store, bus, on_finished=plane.on_download_finished)
            except ImportError:
                downloads = None
        app.state.router = plane
        app.state.bus = bus
        app.state.store = store
        app.state.downloads = downloads
        app.state.metrics = metrics
        await plane.start()
        app.state.stats = live_stats.StatsRecorder(plane)
        app.state.stats.start()
        loop = asyncio.get_running_loop()
        if handle_sighup:
            loop.add_signal_handler(signal.SIGHUP, plane.reload_soon, "SIGHUP")
        try:
            yield
        finally:
            if handle_sighup:
                loop.remove_signal_handler(signal.SIGHUP)
            await app.state.stats.close()
            if downloads is not None:
                with contextlib.suppress(Exception):
                    await downloads.close()
            await plane.close()

    app = FastAPI(title="corral", version="0.1.0", lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    _install_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(management_routes.router)
    app.include_router(ollama_routes.router)
    app.include_router(ollama_models.router)
    app.include_router(anthropic_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(page_routes.router)
    app.include_router(live_stats.router)
    app.include_router(tokenize_routes.router)
    bodies: dict[tuple[str, str], Any] = {}
    try:
        from corral.api.store_routes import PullBody
        from corral.api.store_routes import router as store_router
        app.include_router(store_router)
        bodies = {("post", "/models/pull"): PullBody, ("post", "/models"): PullBody}
    except ImportError as exc:
        log.warning("store routes unavailable: %s", exc)
    document_request_bodies(app, {**bodies, **tokenize_routes.BODIES})

    def server() -> Any:
        plane = getattr(app.state, "router", None)
        return plane.config.server if plane is not None else config.server

    hot = [openai_routes.router, ollama_routes.router, anthropic_routes.router, responses_routes.router]
    app.add_middleware(HotRoutes, fastapi_app=app, routers=hot)  # inside the guard: added first
    app.add_middleware(GuardMiddleware, get_server=server)
    return app
