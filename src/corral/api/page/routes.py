"""The web page and the read-only routes made for it and for the command line.

    GET /                  the page (static HTML; no API key needed: it holds no data)
    GET /ui/{asset}        its script and style sheet (a fixed list of files in the package)
    GET /models/show?model=ID
                           a model's GGUF metadata: architecture, parameters, quantization,
                           context length, chat template (`corral show`)

The page asks for the API key itself and sends it as ``Authorization: Bearer`` on every
data route; the events stream is read with fetch(), not EventSource, so it carries the
header too. Assets ship inside the package (``corral/api/page/static``): no CDN, no build.
"""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral.api.http import json_response, plane_of
from corral.errors import InvalidRequest, ModelFileMissing, NotFound, UnreadableModel

__all__ = ["router", "PUBLIC_PATHS", "is_public_path"]

router = APIRouter()

_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "models.js": "text/javascript; charset=utf-8",
    "downloads.js": "text/javascript; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
PUBLIC_PATHS = frozenset({"/", "/health", *(f"/ui/{name}" for name in _ASSETS)})
_SECURITY_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                                "base-uri 'none'; form-action 'none'"),
}


def is_public_path(path: str) -> bool:
    """The paths served without the API key: the page, its assets and /health."""
    return path in PUBLIC_PATHS


def _asset(name: str) -> bytes:
    return resources.files("corral.api.page").joinpath("static", name).read_bytes()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def page() -> Response:
    """The page; ``HEAD /`` too, the probe Claude Code sends its base URL before a session."""
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8",
                    headers=_SECURITY_HEADERS)


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    media = _ASSETS.get(name)
    if media is None:
        raise NotFound(f"GET /ui/{name}: no such asset")
    return Response(_asset(name), media_type=media, headers=_SECURITY_HEADERS)


@router.get("/models/show")
async def show_model(request: Request, model: str = "") -> Response:
    """A model and its GGUF header (read off the event loop). A file that does not read as
    GGUF is the model's status ``failed`` with the reason (for corral's own worker; another
    ``worker_command`` reads its files its own way: 400 unreadable_model)."""
    if not model:
        raise InvalidRequest("model: required (GET /models/show?model=ID)", param="model")
    plane = plane_of(request)
    pool = plane.pool(model)
    path = Path(pool.spec.path)
    status = pool.status()
    body: dict[str, Any] = {"id": pool.spec.id, "aliases": list(pool.spec.aliases),
                            "path": str(path), "source": pool.spec.source,
                            "status": status, "reason": pool.failure_reason if status == "failed" else None}
    from corral.store.gguf import GGUFError
    from corral.store.gguf_meta import read_gguf_info
    try:
        body.update(await asyncio.to_thread(read_gguf_info, path))
    except FileNotFoundError:
        raise ModelFileMissing(f"model {pool.spec.id!r}: its file {str(path)!r} is missing",
                               param="model") from None
    except GGUFError as exc:
        if plane.config.server.worker_command is not None:
            raise UnreadableModel(f"model {pool.spec.id!r}: cannot read its GGUF header: {exc}",
                                  param="model") from None
        body.update(status="failed", reason=str(exc))
    return json_response(body)
