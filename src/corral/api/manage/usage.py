"""GET /usage: requests and tokens per key, model and UTC day (corral.control.keys.usage).

    GET /usage[?key=NAME][&model=ID][&since=YYYY-MM-DD]
    -> {"data": [{"key", "model", "day", "requests", "prompt_tokens", "completion_tokens"}]}

An admin key sees every key's usage (``?key=`` narrows it); any other key sees its own
only (asking for another key's is 403). Without keys configured the caller is the
anonymous ``-``, with every scope.
"""

from __future__ import annotations

import asyncio
import datetime

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral.api.http import json_response, plane_of
from corral.control.keys.ring import current_caller
from corral.errors import InvalidRequest, ScopeDenied

__all__ = ["router"]

router = APIRouter()


@router.get("/usage")
async def usage(request: Request, key: str | None = None, model: str | None = None,
                since: str | None = None) -> Response:
    if since is not None:
        try:
            since = datetime.date.fromisoformat(since).isoformat()
        except ValueError:
            raise InvalidRequest(f"since: {since!r} is not a date (YYYY-MM-DD)", param="since") from None
    caller = current_caller()
    if caller is not None and not caller.key.allows("admin"):
        if key is not None and key != caller.name:
            raise ScopeDenied(f"key {caller.name!r} may see its own usage only (the 'admin' scope "
                              "sees every key's)")
        key = caller.name
    book = plane_of(request).access.usage
    rows = await asyncio.to_thread(book.query, key=key, model=model, since=since)
    return json_response({"data": rows})
