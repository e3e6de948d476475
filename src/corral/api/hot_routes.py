"""The generation routes, reached without Starlette's routing layers.

A request to ``POST /v1/completions`` (and the other routes ``corral.api.route_table``
marks hot, ``HOT_PATHS``) goes through the guard and then straight to its endpoint
function: no route matching over every route, no dependency solving, no exception-middleware and exit-stack wrappers
(about a third of the router's CPU for a 1-token request, measured with py-spy). The
endpoint is the very function FastAPI registered (so /openapi.json, the route list
and any request that misses this layer are unchanged), called with a Starlette
``Request``; its exceptions go to the app's own exception handlers, so errors look
exactly as on the routed path.

The layer sits inside ``GuardMiddleware`` (Host, Origin, key, content type and body
size are checked first, as for every route) and outside Starlette's
``ExceptionMiddleware``. Only POST and only exact paths; anything else passes through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.api.route_table import ROUTES, served

__all__ = ["HOT_PATHS", "HotRoutes"]

# the routes the table marks hot (corral.api.route_table.ROUTES): POST only
HOT_PATHS = frozenset(path for (method, path), route in ROUTES.items() if route.hot and method == "POST")

Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Exception], Any]


class HotRoutes:
    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        """Built with the middleware stack, once every route of ``fastapi_app`` is in."""
        self.app = app
        self._fastapi = fastapi_app
        self.endpoints: dict[str, Endpoint] = {}
        for path, route in served(fastapi_app.routes):
            if (isinstance(route, APIRoute) and path in HOT_PATHS and "POST" in (route.methods or ())
                    and _takes_only_request(route)):
                self.endpoints.setdefault(path, route.endpoint)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                await self._serve(endpoint, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request)
        except Exception as exc:
            handler = self._handler_for(exc)
            if handler is None:
                raise  # ServerErrorMiddleware's 500, as on the routed path
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> Handler | None:
        handlers = self._fastapi.exception_handlers
        for cls in type(exc).__mro__:
            if cls in handlers:
                found: Handler = handlers[cls]
                return found
        return None


def _takes_only_request(route: APIRoute) -> bool:
    """True when FastAPI would call the endpoint with the request alone (no params,
    no body model, no dependencies): then calling it directly is the same call."""
    dep = route.dependant
    return (not dep.path_params and not dep.query_params and not dep.header_params
            and not dep.cookie_params and not dep.body_params and not dep.dependencies
            and dep.request_param_name is not None)
