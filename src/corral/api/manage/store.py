"""HTTP routes of the model store: pull, cancel a pull, delete a model.

    POST   /models/pull          {"model": SOURCE, "sha256"?: hex, "id"?: model id}
                                 -> 202 {"id": PULL_ID, "model": MODEL_ID, "status"}
    POST   /models               the same body (llama.cpp router style)
    GET    /models/pull/{pull}   the pull's state and progress
    DELETE /models/pull/{pull}   cancel (404 unknown, 409 already ended)
    DELETE /models/{id}[?force=true]
                                 remove from disk; 409 while loaded or downloading
                                 unless force (which unloads / cancels first)

The app provides ``app.state.downloads`` (DownloadManager), ``app.state.store``
(ModelStore) and ``app.state.router`` (the control plane, as ``ModelHolder`` below
describes what these routes use of it). Errors are ``corral.errors`` exceptions; the
app's handler turns them into OpenAI-style bodies.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from corral.store.downloads import DownloadManager, PullHandle
from corral.api.core.schemas import parse_body
from corral.api.http import downloads_of, store_of
from corral.control.scheduling.pool import ModelPool
from corral.errors import Conflict, ModelNotFound, NotFound
from corral.store.local import ModelStore

__all__ = ["router", "PullBody", "ModelHolder", "remove_from_store"]

router = APIRouter()


class ModelHolder(Protocol):
    """What the store routes need of the control plane (``ControlPlane`` is one)."""

    def is_loaded(self, model_id: str, /) -> bool:
        """Loaded or loading."""

    def pool(self, name: str, /) -> ModelPool:
        """The model a name names (``ModelNotFound`` when it names none)."""

    async def unload(self, pool: ModelPool, /) -> object:
        """Stop its workers (after its running requests)."""

    async def remove_model(self, model_id: str, /) -> None:
        """Forget it (its file is gone): out of the catalog, ``model_removed`` published."""


class PullBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=2048, description="the source to pull")
    sha256: str | None = Field(default=None, description="expected sha256 (hex)")
    id: str | None = Field(default=None, description="the model id (default: file stem)")


def _downloads(request: Request) -> DownloadManager:
    dm: DownloadManager | None = downloads_of(request)
    if dm is None:  # an app made without a store (create_app(use_store=False))
        raise NotFound("this server has no model store: nothing to pull or delete")
    return dm


def _holder(request: Request) -> ModelHolder:
    holder: ModelHolder = request.app.state.router
    return holder


def _store(request: Request) -> ModelStore:
    store: ModelStore | None = store_of(request)
    if store is None:
        raise NotFound("this server has no model store: nothing to pull or delete")
    return store


def _pull_body(h: PullHandle) -> dict[str, Any]:
    return {"id": h.pull_id, "model": h.model_id, "status": h.state, "source": h.source,
            "done": h.done, "total": h.total, "rate_bps": round(h.rate_bps, 1),
            "eta_s": h.eta_s, "reason": h.reason}


async def _pull(request: Request) -> JSONResponse:
    body = await parse_body(request, PullBody)
    h = await _downloads(request).start(body.model, sha256=body.sha256, model_id=body.id)
    return JSONResponse(_pull_body(h), status_code=202)


@router.post("/models/pull", status_code=202)
async def pull_model(request: Request) -> JSONResponse:
    return await _pull(request)


@router.post("/models", status_code=202)
async def add_model(request: Request) -> JSONResponse:
    return await _pull(request)


@router.get("/models/pull/{pull_id}")
async def get_pull(pull_id: str, request: Request) -> dict[str, Any]:
    h = _downloads(request).get(pull_id)
    if h is None:
        raise NotFound(f"no pull with id {pull_id!r}", param="pull_id")
    return _pull_body(h)


@router.delete("/models/pull/{pull_id}")
async def cancel_pull(pull_id: str, request: Request) -> dict[str, Any]:
    raw = request.scope.get("raw_path") or b""
    if not raw.startswith(b"/models/pull/"):  # /models/pull%2F...: a model id, not this route
        force = request.query_params.get("force", "false").lower() in ("1", "true", "yes")
        return await remove_from_store(request, f"pull/{pull_id}", force=force)
    dm = _downloads(request)
    h = dm.get(pull_id)
    if h is None:
        raise NotFound(f"no pull with id {pull_id!r}", param="pull_id")
    if not await dm.cancel(pull_id):
        raise Conflict(f"pull {pull_id} already ended ({h.state})", param="pull_id")
    return _pull_body(h)


@router.delete("/models/{model_id:path}")
async def delete_model(model_id: str, request: Request, force: bool = False) -> dict[str, Any]:
    return await remove_from_store(request, model_id, force=force)


async def remove_from_store(request: Request, model_id: str, *, force: bool) -> dict[str, Any]:
    """Delete a model's file (and manifest); ``force`` unloads it / cancels its pull first.
    Also used by Ollama's DELETE /api/delete."""
    dm = _downloads(request)
    store = _store(request)
    pulling = dm.find_by_model(model_id)
    if pulling is not None:
        if not force:
            raise Conflict(f"model {model_id!r} is downloading ({pulling.pull_id}); cancel it "
                           "first or delete with force=true", param="model")
        await dm.cancel(pulling.pull_id)
    if await asyncio.to_thread(store.get, model_id) is None:  # lists models_dir: off the loop
        if pulling is not None:
            return {"id": model_id, "deleted": False, "cancelled": pulling.pull_id}
        raise ModelNotFound(f"model {model_id!r} is not in the store", param="model")
    holder = _holder(request)
    if holder.is_loaded(model_id):
        if not force:
            raise Conflict(f"model {model_id!r} is loaded; unload it first or delete with "
                           "force=true", param="model")
        await holder.unload(holder.pool(model_id))
    removed = await asyncio.to_thread(store.remove, model_id)
    await holder.remove_model(model_id)  # drops it from the catalog; model_removed event
    return {"id": model_id, "deleted": True, "path": str(removed.path)}
