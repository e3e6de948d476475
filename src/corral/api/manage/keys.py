"""Keys for an admin, over HTTP (the page's "Keys and usage" panel; `corral keys` edits the same file):

    GET    /keys               every key: name, prefix, scopes, models, limits, weight, created,
                               last_used (epoch seconds, since this router started; null: not
                               since); never a secret (the file holds none)
    POST   /keys               {"name", "scopes"?, "models"?, "rpm"?, "tpm"?, "tpd"?,
                               "concurrency"?, "queue"?} -> 201 with "secret": shown this once
    DELETE /keys/{name}        revoke: the key is refused from the next request on
    GET    /usage/now          who is running and queued now, per key and model (the fair-share
                               queues); an infer key sees its own only

The key routes need ``admin``; they edit ``[server] keys_file`` under its lock
(``corral.config.keys_file.locked_keys``) and make the router read it again at once, so a
revoked key stops at once. Without a keys file: 409 (the single ``--api-key`` is not editable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from corral.api.core.schemas import parse_body
from corral.api.http import json_response, plane_of
from corral.config.keys_file import (SCOPES, KeySpec, hash_secret, locked_keys, name_problem, new_secret,
                                     now_iso)
from corral.control.keys.ring import API_KEY_NAME, current_caller
from corral.errors import ConfigError, Conflict, InvalidRequest, NotFound

__all__ = ["router"]

router = APIRouter()
_LIMITS = ("rpm", "tpm", "tpd", "concurrency", "queue")
_edit = asyncio.Lock()  # one edit of the keys file at a time in this router (the file lock orders the rest)


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    scopes: list[str] = Field(default_factory=lambda: ["infer"], min_length=1, max_length=3)
    models: list[str] = Field(default_factory=list, max_length=64)
    rpm: int | None = Field(default=None, ge=1, le=10**9)
    tpm: int | None = Field(default=None, ge=1, le=10**12)
    tpd: int | None = Field(default=None, ge=1, le=10**13)
    concurrency: int | None = Field(default=None, ge=1, le=10**6)
    queue: int | None = Field(default=None, ge=0, le=10**6)


def _keys_file(request: Request) -> Path:
    path = plane_of(request).config.server.keys_file
    if path is None:
        raise Conflict("this server has no keys file ([server] keys_file): keys cannot be created or "
                       "revoked here; start it with one")
    return Path(path).expanduser()


def _row(name: str, spec: KeySpec, last_used: float | None) -> dict[str, Any]:
    d = msgspec.structs.asdict(spec)
    d.pop("hash")
    return {"name": name, **d, "last_used": last_used}


@router.get("/keys")
async def list_keys(request: Request) -> Response:
    plane = plane_of(request)
    ring, used = plane.access.keys, plane.access.last_used
    rows = [_row(k, ring.get(k).spec, used.get(k)) for k in ring.names() if ring.get(k) is not None]  # type: ignore[union-attr]
    admin = ring.get(API_KEY_NAME)
    if admin is not None:  # the [server] api_key: listed, not editable here
        rows.insert(0, {**_row(API_KEY_NAME, admin.spec, used.get(API_KEY_NAME)), "editable": False})
    return json_response({"data": rows, "keys_file": plane.config.server.keys_file is not None})


@router.post("/keys", status_code=201)
async def create_key(request: Request) -> Response:
    body = await parse_body(request, NewKey)
    problem = name_problem(body.name)
    if problem is not None:
        raise InvalidRequest(f"name: {problem}", param="name")
    bad = [s for s in body.scopes if s not in SCOPES]
    if bad:
        raise InvalidRequest(f"scopes: {bad[0][:40]!r} is not a scope ({', '.join(SCOPES)})", param="scopes")
    if any(not m.strip() or len(m) > 256 for m in body.models):
        raise InvalidRequest("models: each is a model id, alias or glob pattern (1-256 characters)", param="models")
    path = _keys_file(request)
    secret = new_secret()
    spec = KeySpec(hash=hash_secret(secret), prefix=secret[:8], scopes=tuple(dict.fromkeys(body.scopes)),
                   models=tuple(body.models), created=now_iso(), **{f: getattr(body, f) for f in _LIMITS})

    def add() -> None:
        with locked_keys(path) as keys:
            if body.name in keys:
                raise Conflict(f"key {body.name!r} already exists; revoke it first or choose another name",
                               param="name")
            keys[body.name] = spec

    await _write(request, add)
    return json_response({**_row(body.name, spec, None), "secret": secret}, status=201)


@router.delete("/keys/{name}")
async def revoke_key(request: Request, name: str) -> Response:
    path = _keys_file(request)

    def remove() -> None:
        with locked_keys(path) as keys:
            if name not in keys:
                raise NotFound(f"no key {name[:64]!r} in the keys file", param="name")
            del keys[name]

    await _write(request, remove)
    return json_response({"name": name, "revoked": True})


async def _write(request: Request, edit: Callable[[], None]) -> None:
    async with _edit:
        try:
            await asyncio.to_thread(edit)
        except ConfigError as exc:
            raise Conflict(f"the keys file: {exc.message}") from None
    plane_of(request).access.keys.reload("edited over HTTP")  # refused or accepted from the next request on


@router.get("/usage/now")
async def usage_now(request: Request) -> Response:
    plane = plane_of(request)
    caller = current_caller()
    own = caller.name if caller is not None and not caller.key.allows("admin") else None
    rows = []
    for pool in plane.pools.values():
        for key, (running, queued) in pool.waiters.by_key().items():
            if own is None or key == own:
                rows.append({"key": key, "model": pool.spec.id, "running": running, "queued": queued})
    rows.sort(key=lambda r: (r["key"], r["model"]))
    return json_response({"data": rows})
