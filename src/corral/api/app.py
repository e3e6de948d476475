"""The FastAPI application: state, middleware, error mapping, routes.

``create_app(config)`` builds the app; its lifespan creates the EventBus, the
ModelStore, the ControlPlane (``app.state.router``) and the DownloadManager, and
stops every worker on shutdown. Errors: one handler maps every ``CorralError`` with
``to_body()``/``status``/``headers()``; validation errors become 400 naming the field
(never 422); unknown routes 404; anything else 500 with no traceback in the body.

``corral.api.guard.GuardMiddleware`` runs before every route: Host and Origin checks,
CORS for ``allowed_origins``, the keys (every route but /health; scopes per route in
``corral.api.scopes``, limits in ``corral.api.access``), JSON content type and body size.
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

from corral.api.anthropic import routes as anthropic_routes
from corral.api.llamacpp import infill as infill_routes
from corral.api.llamacpp import inspect as inspect_routes
from corral.api.llamacpp import lora_adapters as lora_routes
from corral.api.llamacpp import rerank as rerank_routes
from corral.api.llamacpp import schemas as llamacpp_schemas
from corral.api.llamacpp import slot_files as slot_file_routes
from corral.api.llamacpp import streams as stream_routes
from corral.api.manage import keys as key_routes
from corral.api.manage import models as management_routes
from corral.api.manage import store as store_routes
from corral.api.manage import usage as usage_routes
from corral.api.ollama import create as ollama_create
from corral.api.ollama import models as ollama_models
from corral.api.ollama import routes as ollama_routes
from corral.api.openai import audio_routes
from corral.api.openai import responses as responses_routes
from corral.api.openai import routes as openai_routes
from corral.api.openai import tokenize as tokenize_routes
from corral.api.page import hub as hub_routes
from corral.api.page import live_stats
from corral.api.page import routes as page_routes
from corral.api.guard import GuardMiddleware
from corral.api.overload import LoadMonitor, freeze_startup_objects
from corral.api.http import error_response, invalid_request, path_policy
from corral.api.hot_routes import HotRoutes
from corral.api.route_table import app_routes
from corral.api.scopes import RouteScopes
from corral.api.openapi_doc import document_request_bodies
from corral.config.file import CorralConfig, ServerConfig
from corral.control.keys.access import Access
from corral.events import EventBus
from corral.control.metrics import Metrics
from corral.control.plane import ControlPlane
from corral.errors import CorralError, InternalError, error_for_status
from corral.store.downloads import DownloadManager
from corral.store.embedded import EMBEDDED_MODEL_ALIASES, EMBEDDED_MODEL_ID, embedded_model_path
from corral.store.llama_cache import llama_cache_dir
from corral.store.local import ModelStore, default_models_dir

__all__ = ["create_app"]

log = logging.getLogger("corral.api")


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> Response:
        if exc.status >= 500:
            log.warning("%s %s -> %d %s", request.method, request.url.path, exc.status, exc.message)
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(request.url.path, invalid_request(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        err = error_for_status(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        resp = error_response(request.url.path, err)
        resp.headers.update(getattr(exc, "headers", None) or {})
        return resp

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(request.url.path, InternalError("internal server error (see the server log)"))


def _embedded() -> tuple[str, Path, tuple[str, ...]] | None:
    try:
        return EMBEDDED_MODEL_ID, embedded_model_path(), tuple(EMBEDDED_MODEL_ALIASES)
    except Exception as exc:  # noqa: BLE001 - the model's package is missing or broken: serve without it
        log.warning("embedded default model unavailable: %s", exc)
        return None


def _pull_policy(srv: ServerConfig) -> bool | list[str]:
    """``allow_private_pull_urls`` as the download child gets it (store/address_policy.py)."""
    private = srv.allow_private_pull_urls
    return private if isinstance(private, bool) else [str(n) for n in private]


def _store(config: CorralConfig) -> ModelStore:
    return ModelStore(config.server.models_dir or default_models_dir(),
                      llama_cache=llama_cache_dir() if config.server.llama_cache else None)


def create_app(config: CorralConfig, *, config_loader: Callable[[], CorralConfig] | None = None,
               embedded: bool | tuple[str, Path, tuple[str, ...]] | None = True,
               use_store: bool = True, handle_sighup: bool = False, freeze_gc: bool = False) -> FastAPI:
    """The router app. ``embedded=True`` serves the embedded default model (unless the
    config turns it off); ``use_store`` lists models_dir; ``handle_sighup`` reloads on SIGHUP;
    ``freeze_gc``: ``gc.freeze()`` once started (the server process: ``corral serve``; not an
    app of a test, whose process goes on to build others)."""

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
            downloads = DownloadManager(store, bus, on_finished=plane.on_download_finished,
                                        allow_private=lambda: _pull_policy(plane.config.server))
        holder: store_routes.ModelHolder = plane  # what the store routes use of it (mypy checks it)
        app.state.router = holder
        app.state.bus = bus
        app.state.store = store
        app.state.downloads = downloads
        app.state.metrics = metrics
        responses_routes.open_store(app.state, config.server.state_dir)
        ollama_create.open_created(app.state, config.server.state_dir)
        await plane.start()
        for rec in app.state.created.load():  # models made with Ollama's create, kept across restarts
            try:
                await plane.add_model(ollama_create.spec_of(rec))
            except Exception as exc:  # noqa: BLE001 - one broken record must not stop the server (logged)
                log.warning("created model %s not added: %s", rec.name, exc)
        app.state.stats = live_stats.StatsRecorder(plane)
        app.state.stats.start()
        if freeze_gc:
            freeze_startup_objects()  # what exists now is never collected (api/overload.py)
        app.state.load = LoadMonitor()  # the loop's lag: shedding past saturation (api/overload.py)
        app.state.load.start()
        metrics.registry.register(app.state.load.collector())
        loop = asyncio.get_running_loop()
        if handle_sighup:
            loop.add_signal_handler(signal.SIGHUP, plane.reload_soon, "SIGHUP")
        try:
            yield
        finally:
            if handle_sighup:
                loop.remove_signal_handler(signal.SIGHUP)
            await app.state.stats.close()
            await app.state.load.close()
            if downloads is not None:
                with contextlib.suppress(Exception):
                    await downloads.close()
            await plane.close()
            app.state.responses.close()

    app = FastAPI(title="corral", version="0.1.0", lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    _install_handlers(app)
    app.include_router(openai_routes.router)
    app.include_router(management_routes.router)
    app.include_router(ollama_routes.router)
    app.include_router(ollama_models.router)
    app.include_router(ollama_create.router)
    app.include_router(anthropic_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(audio_routes.router)
    app.include_router(page_routes.router)
    app.include_router(hub_routes.router)
    app.include_router(live_stats.router)
    app.include_router(tokenize_routes.router)
    app.include_router(store_routes.router)
    app.include_router(key_routes.router)
    app.include_router(usage_routes.router)
    for part in (infill_routes, rerank_routes, inspect_routes, slot_file_routes, lora_routes,
                 stream_routes):  # llama-server's own routes
        app.include_router(part.router)
    bodies: dict[tuple[str, str], Any] = {("post", "/models/pull"): store_routes.PullBody,
                                          ("post", "/models"): store_routes.PullBody}
    document_request_bodies(app, {**bodies, **tokenize_routes.BODIES, **llamacpp_schemas.BODIES})

    def server() -> ServerConfig:
        plane = getattr(app.state, "router", None)
        return plane.config.server if plane is not None else config.server

    app.add_middleware(HotRoutes, fastapi_app=app)  # inside the guard: added first
    def access() -> Access | None:
        plane = getattr(app.state, "router", None)
        return plane.access if plane is not None else None

    app.add_middleware(GuardMiddleware, get_server=server, get_access=access,
                       routes=lambda: RouteScopes(app_routes(app.routes)),
                       get_load=lambda: getattr(app.state, "load", None))
    return app
