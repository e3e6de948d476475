"""Management routes: llama.cpp-router compatible /models*, Nitro's loadmodel, health, metrics.

    GET  /models                 every model: id, aliases, status.value (unloaded, loading,
                                 loaded, failed, downloading) and per instance: state, pid,
                                 slots busy/total, memory, last used, failure reason, exit code;
                                 adapter model ids too, with ``adapter.base`` (api/core/adapter_models.py)
    GET  /models/events          SSE: every EventBus event as data: {"event", "model", ...}
    POST /models/load            {"model": ID} -> {"success": true} once loaded (an adapter
                                 model id loads its base: ``"base"`` names it)
    POST /models/unload          {"model": ID} -> {"success": true}; cancels a download; an
                                 adapter model id unloads its base
    POST /models/reload          re-read the config file and models_dir
    POST /inferences/llamacpp/loadmodel    Nitro: load a model that is not in the config
    POST /inferences/llamacpp/unloadmodel  Nitro: {"model_id": ID} (GET: 405, no state change on GET)
    GET  /health, GET /metrics (Prometheus); /health has a "ray" section with ray_address
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral.api.core.adapter_models import AdapterModel, adapter_models, serving_model
from corral.api.core.target import pull_if_needed
from corral.api.http import downloads_of, json_response, path_policy, plane_of, sse_data
from corral.api.core.schemas import (ModelRef, NitroLoadModel, NitroUnloadModel, nitro_changes, nitro_settings,
                                parse_body)
from corral.control.catalog import ModelSpec
from corral.errors import (ConfigError, Conflict, InvalidConfig, InvalidRequest, LoadFailed, ModelNotFound,
                           MethodNotAllowed, NitroLoadFailed)
from corral.store.gguf import check_file
from corral.store.local import validate_model_id

__all__ = ["router"]

router = APIRouter()
_json = msgspec.json.Encoder()
_KEEPALIVE_S = 15.0


@router.get("/health")
async def health(request: Request) -> Response:
    plane = plane_of(request)
    loaded = sum(1 for p in plane.pools.values() if p.status() == "loaded")
    body: dict[str, Any] = {"status": "ok", "models": len(plane.pools), "loaded": loaded}
    if plane.ray is not None:  # the Ray cluster: status (reason when not connected) and nodes
        body["ray"] = plane.ray.view()
    return json_response(body)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(plane_of(request).metrics.render(),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/models")
async def list_models(request: Request) -> Response:
    plane = plane_of(request)
    dm = downloads_of(request)
    data = []
    visible = plane.visible_pools()  # the models the request's key may use
    for pool in visible:
        entry = plane.describe(pool)
        entry["variant_of"] = plane.variant_of(pool)  # a variant: its own id, served by another's instances
        progress = dm.progress(pool.spec.id) if dm is not None else None
        if progress is not None and entry["status"]["value"] == "unloaded":
            entry["status"]["value"] = "downloading"
            entry["status"]["progress"] = progress
        data.append(entry)
    by_id = {d["id"]: d for d in data}
    data += [_adapter_entry(m, by_id[m.base.spec.id]) for m in adapter_models(plane)]
    known = {d["id"] for d in data}
    if dm is not None:
        for h in dm.active():
            if h.model_id not in known and plane.access.visible_id(h.model_id):
                data.append({"id": h.model_id, "object": "model", "owned_by": "corral",
                             "aliases": [], "source": h.source, "in_cache": False,
                             "status": {"value": "downloading", "failed": False,
                                        "progress": h.progress()},
                             "instances": []})
                known.add(h.model_id)
    gpus = plane.admission.gpus
    return json_response({"object": "list", "data": data,
                          "gpus": gpus.describe(visible) if gpus is not None else []})


def _adapter_entry(m: AdapterModel, base: dict[str, Any]) -> dict[str, Any]:
    """An adapter model id (api/core/adapter_models.py): the base's status and settings, its
    ``adapter`` (base, id, index, scale, path); no instances of its own (the base's run it)."""
    return {"id": m.id, "object": "model", "owned_by": "corral", "created": base["created"], "aliases": [],
            "path": m.adapter.path, "source": base["source"],
            "in_cache": base["in_cache"] and Path(m.adapter.path).exists(),
            "vision": False, "audio": False, "mmproj": None, "adapter": m.describe(),
            "status": {k: v for k, v in base["status"].items() if k != "progress"},  # the base's download's
            "settings": base["settings"], "queued": 0, "last_used": base["last_used"], "memory_bytes": 0,
            "instances": []}


@router.get("/models/events")
@router.get("/models/sse", include_in_schema=False)
async def model_events(request: Request) -> StreamingResponse:
    bus = plane_of(request).bus

    async def events() -> AsyncIterator[bytes]:
        async with bus.subscribe() as q:
            yield b": connected\n\n"
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), _KEEPALIVE_S)
                except asyncio.TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                yield sse_data(dict(ev))

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/models/load")
async def load_model(request: Request) -> Response:
    body = await parse_body(request, ModelRef)
    dm = downloads_of(request)
    pull = dm.find_by_model(body.model) if dm is not None else None
    if pull is not None and body.model not in plane_of(request).pools:
        raise Conflict(f"model {body.model!r} is still downloading ({pull.pull_id}); load it when "
                       "the download has finished", param="model")
    plane = plane_of(request)
    served = serving_model(plane, body.model)
    pool = plane.pool(served)
    pull_if_needed(request, pool)  # a model pulled when first needed: 503 while it is pulled
    await plane.load(pool)
    return json_response({"success": True, **_base_of(body.model, served)})


@router.post("/models/unload")
async def unload_model(request: Request) -> Response:
    body = await parse_body(request, ModelRef)
    dm = downloads_of(request)
    h = dm.find_by_model(body.model) if dm is not None else None
    if dm is not None and h is not None:
        await dm.cancel(h.pull_id)
        return json_response({"success": True, "cancelled": h.pull_id})
    plane = plane_of(request)
    served = serving_model(plane, body.model)
    await plane.unload(plane.pool(served))
    return json_response({"success": True, **_base_of(body.model, served)})


def _base_of(asked: str, served: str) -> dict[str, str]:
    """``{"base": id}`` when an adapter model id was asked for and its base was acted on."""
    return {"base": served} if served != asked else {}


@router.post("/models/reload")
async def reload_models(request: Request) -> Response:
    try:
        result = await plane_of(request).reload()
    except ConfigError as exc:  # the old config stays in force
        raise InvalidConfig(f"config not reloaded: {exc.message}") from None
    return json_response({"success": True, **result})


# ------------------------------------------------------------------------ Nitro


async def _confined_model_file(request: Request, raw: str) -> Path:
    """Nitro's llama_model_path, resolved and allowed (403 naming the setting otherwise);
    only then is the file looked at (off the event loop), so nothing about files outside
    leaks. For corral's own worker its GGUF header must read (``corral.store.gguf``)."""

    path = path_policy(request.app).check(raw, param="llama_model_path")
    if path.is_dir():
        raise InvalidRequest(f"llama_model_path: {raw!r} is a directory, not a model file",
                             param="llama_model_path")
    if not os.path.lexists(path):
        raise InvalidRequest(f"llama_model_path: no file at {raw!r}", param="llama_model_path")
    if plane_of(request).config.server.worker_command is None:
        problem = (await asyncio.to_thread(check_file, path)).problem
        if problem is not None:
            raise InvalidRequest(f"llama_model_path: {raw!r} is not a readable GGUF model file: {problem}",
                                 param="llama_model_path")
    elif not path.is_file():
        raise InvalidRequest(f"llama_model_path: cannot read {raw!r}", param="llama_model_path")
    return path


@router.post("/inferences/llamacpp/loadmodel")
async def nitro_load(request: Request) -> Response:
    body = await parse_body(request, NitroLoadModel)
    plane = plane_of(request)
    validate_model_id(body.model_id, param="model_id")
    plane.sync.check_new_name(body.model_id, "model_id")  # the key's own names, never an adapter's id
    path = await _confined_model_file(request, body.llama_model_path)
    try:
        owner = plane.catalog.resolve_id(body.model_id)
    except ModelNotFound:
        owner = None
    if owner is not None and owner != body.model_id:
        raise Conflict(f"model_id {body.model_id!r} is an alias of model {owner!r}; choose another "
                       "model_id", param="model_id")
    settings = nitro_settings(body, plane.config.inherited_settings())
    spec = ModelSpec.make(body.model_id, path, settings, source="nitro")
    existing = plane.pools.get(body.model_id)
    if existing is not None and existing.spec.source != "nitro" and existing.spec.path != spec.path:
        raise Conflict(f"model_id {body.model_id!r} is already a {existing.spec.source} model "
                       "at another path", param="model_id")
    changed = nitro_changes(body, existing.spec) if existing is not None and existing.spec.source != "nitro" else []
    if existing is not None and changed:  # a config's (or created) model's settings are its own: never dropped silently
        key, asked, has = changed[0]
        raise Conflict(f"{key}: model_id {body.model_id!r} is a {existing.spec.source} model with "
                       f"{key} {has!r}; a loadmodel cannot change it (asked {asked!r}): give another model_id "
                       "(one that differs only in its prompts shares this model's workers)", param=key)
    added = existing is None
    if existing is not None and existing.spec.source == "nitro":
        await plane.add_model(spec, replace=True)
    elif existing is None:
        await plane.add_model(spec)
    already = plane.pools[body.model_id].has_ready
    try:
        await plane.load(plane.pool(body.model_id))
    except LoadFailed as exc:
        if added or (existing is not None and existing.spec.source == "nitro"):
            await plane.remove_model(body.model_id)  # a failed Nitro entry is not kept listed
        reason = exc.message.split("\n", 1)[0]
        raise NitroLoadFailed(f"llama_model_path: the model could not be loaded: {reason}",
                              param="llama_model_path") from None
    return json_response({"message": "Model already loaded" if already else "Model loaded successfully",
                          "code": "ModelAlreadyLoaded" if already else "ModelloadedSuccessfully",
                          "model_id": body.model_id, "success": True})


@router.post("/inferences/llamacpp/unloadmodel")
async def nitro_unload(request: Request) -> Response:
    """POST only: a GET must never change state (an <img> on any web page can send one)."""
    mid = (await parse_body(request, NitroUnloadModel)).model_id
    plane = plane_of(request)
    if mid not in plane.pools:
        raise ModelNotFound(f"model {mid!r} not found", param="model_id")
    await plane.unload(plane.pool(mid))
    return json_response({"message": "Model unloaded successfully", "code": "ModelUnloaded",
                          "model_id": mid, "success": True})


@router.get("/inferences/llamacpp/unloadmodel", include_in_schema=False)
async def nitro_unload_get(request: Request) -> Response:
    raise MethodNotAllowed("GET /inferences/llamacpp/unloadmodel: unloading changes state, so it "
                           'takes POST with {"model_id": ID}')
