"""Ollama's model routes: /api/version, /api/tags, /api/ps, /api/show, /api/pull,
/api/delete, /api/copy.

Models are corral's catalog (config, models_dir, pulls, the embedded default), listed by
id. ``details`` and ``model_info`` come from the GGUF header (``store.gguf_meta``: read
in a thread, cached per file). ``digest`` is the sha256 of a pulled file when the store
knows it, else a stable hash of path, size and mtime (corral never hashes a model just to
list it). /api/pull starts corral's download (same sources as POST /models/pull:
``owner/repo:Q4_K_M``, ``owner/repo/file.gguf``, an https URL; Ollama registry names are
refused with a 400 that says so) and streams Ollama progress objects made from the
download events. A client that goes away does not cancel the download (DELETE
/models/pull/{id} does). /api/copy adds an alias; /api/delete removes a pulled model
(unloading it first).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from corral.control.placement.memory import memory_bytes
from corral import wire
from corral.model import reasoning_format
from corral.model.settings import SAMPLING_KEYS, ModelSettings
from corral.api.core.adapter_models import AdapterModel, adapter_file_size, adapter_models, find_adapter_model
from corral.api.http import created_of, downloads_of, json_response, ndjson_line, plane_of, store_of
from corral.api.ollama.create import blob_store
from corral.api.ollama.schemas import SPELLING, OllamaCopyRequest, OllamaModelRequest, OllamaPullRequest
from corral.api.core.schemas import parse_body
from corral.api.manage.store import remove_from_store
from corral.events import Event
from corral.control.capabilities import can
from corral.control.scheduling.pool import ModelPool
from corral.errors import Conflict, DownloadError, InvalidRequest, ModelNotFound
from corral.store.gguf_meta import GGUFMetadata, parameter_size, read_metadata
from corral.store.pulls import PullHandle

__all__ = ["router", "OLLAMA_API_VERSION"]

router = APIRouter()
OLLAMA_API_VERSION = "0.6.0"  # the Ollama API version whose routes and fields corral answers
_FOREVER = "2318-01-01T00:00:00Z"  # expires_at of a model with no idle unload (Ollama does the same)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _expires_at(last_used: float, ttl: float | None) -> str:
    """When an idle model unloads; _FOREVER for never, or for a ttl that reaches past it
    (keep_alive is bounded where it is parsed, ollama/schemas.py, and the config's ttl_s)."""
    forever = datetime.fromisoformat(_FOREVER.replace("Z", "+00:00")).timestamp()
    if ttl is None or not last_used + ttl < forever:
        return _FOREVER
    return _iso(last_used + ttl)


async def _store_sha(request: Request) -> dict[str, str]:
    """The pulled models' sha256 by id (listing models_dir reads headers: off the loop)."""
    store = store_of(request)
    if store is None:
        return {}
    try:
        return {m.id: m.sha256 for m in await asyncio.to_thread(store.list) if m.sha256}
    except OSError:
        return {}


def _details(meta: GGUFMetadata | None) -> dict[str, Any]:
    arch = meta.architecture if meta else None
    return {"parent_model": "", "format": "gguf", "family": arch or "",
            "families": [arch] if arch else None,
            "parameter_size": parameter_size(meta.n_params) if meta else "",
            "quantization_level": (meta.quantization if meta else None) or ""}


def _entry(pool: ModelPool, meta: GGUFMetadata | None, shas: dict[str, str]) -> dict[str, Any]:
    spec = pool.spec
    try:
        st = spec.path.stat()
        size, mtime = st.st_size, st.st_mtime
    except OSError:
        size, mtime = 0, 0.0
    digest = shas.get(spec.id) or hashlib.sha256(f"{spec.path}:{size}:{mtime}".encode()).hexdigest()
    failed = {"status": "failed", "reason": pool.failure_reason} if pool.status() == "failed" else {}
    return {"name": spec.id, "model": spec.id, "modified_at": _iso(mtime), "size": size,
            "digest": digest, "details": _details(meta), **failed}  # failed: corral's own fields


async def _metas(pools: list[ModelPool]) -> list[GGUFMetadata | None]:
    return await asyncio.to_thread(lambda: [read_metadata(p.spec.path) for p in pools])


@router.get("/api/version")
async def version() -> Response:
    return json_response({"version": OLLAMA_API_VERSION})


def _adapter_entry(m: AdapterModel, base: dict[str, Any]) -> dict[str, Any]:
    """An adapter model (api/core/adapter_models.py) as Ollama lists a model made ``FROM`` a
    base with an ``ADAPTER``: the base's details with ``parent_model``, both files' bytes."""
    size, mtime = adapter_file_size(m)
    digest = hashlib.sha256(f"{base['digest']}:{m.adapter.path}:{size}:{mtime}".encode()).hexdigest()
    return {**base, "name": m.id, "model": m.id, "size": base["size"] + size, "digest": digest,
            "modified_at": max(base["modified_at"], _iso(mtime)),
            "details": {**base["details"], "parent_model": m.base.spec.id}}


@router.get("/api/tags")
async def tags(request: Request) -> Response:
    plane = plane_of(request)
    pools, adapters = plane.visible_pools(), adapter_models(plane)
    shas = await _store_sha(request)
    metas = await _metas(pools + [a.base for a in adapters])
    entries = [_entry(p, m, shas) for p, m in zip(pools + [a.base for a in adapters], metas)]
    return json_response({"models": entries[:len(pools)] + [
        _adapter_entry(a, e) for a, e in zip(adapters, entries[len(pools):])]})


@router.get("/api/ps")
async def ps(request: Request) -> Response:
    """The loaded models, their variants (control/plane.py's serving) and the adapter models
    whose base is loaded: a variant's or an adapter model's entry shows the memory of the
    model it runs on (its workers; ``variant_of`` names that model)."""
    plane = plane_of(request)
    listed = [(p, plane.serving(p)) for p in plane.visible_pools()]
    rows = [(p, runs_on) for p, runs_on in listed if runs_on.status() == "loaded"]
    adapters = [a for a in adapter_models(plane) if a.base.status() == "loaded"]
    shas = await _store_sha(request)
    pools = [p for p, _ in rows] + [a.base for a in adapters]
    out = []
    for (pool, runs_on), meta in zip([*rows, *((a.base, a.base) for a in adapters)], await _metas(pools)):
        size, size_vram = _sizes(runs_on)
        slot = next((i.info.n_ctx_slot for i in runs_on.instances if i.info is not None),
                    runs_on.spec.slot_ctx())
        variant = {"variant_of": plane.variant_of(pool)} if runs_on is not pool else {}  # corral's own field
        out.append({**_entry(pool, meta, shas), "size": size, "size_vram": size_vram,
                    "expires_at": _expires_at(runs_on.last_used, runs_on.ttl_s),
                    "context_length": slot, **variant})
    return json_response({"models": out[:len(rows)] + [
        {**_adapter_entry(a, e), "size": e["size"], "size_vram": e["size_vram"]}
        for a, e in zip(adapters, out[len(rows):])]})


def _sizes(pool: ModelPool) -> tuple[int, int]:
    """(size, size_vram): the memory of the model's instances and what of it is on GPUs
    (``ollama ps`` shows "48%/52% CPU/GPU" from them), from the workers' placement
    (layers, KV, compute estimate on each device; the token embeddings, a lookup llama.cpp
    keeps on the host in every case, left out: a model with every layer on a GPU is 100%
    GPU, as in Ollama); without one, the reported host bytes, all of it counted on the GPU
    when any layer is offloaded."""
    infos = [i.info for i in pool.live() if i.info is not None]
    parts = [p for info in infos for p in info.placement]
    if parts:
        on_host, on_gpu = wire.host_and_gpu_bytes(parts)
        return on_gpu + on_host, on_gpu
    size = memory_bytes(pool)
    on_gpu = any(info.gpu_layers != 0 and any(d.kind in ("gpu", "igpu") for d in info.devices) for info in infos)
    return size, size if on_gpu else 0


# the model settings Ollama's PARAMETER lines name otherwise (the token limit as its options do)
_OLLAMA_NAMES = {"default_max_tokens": SPELLING["max_tokens"]}


def _license(request: Request, model_id: str) -> list[str]:
    created = created_of(request)
    if created is None:
        return []
    return next((r.license for r in created.load() if r.name == model_id), [])


def modelfile_parameters(spec: ModelSettings) -> list[str]:
    """The generation defaults the model sets, as Ollama's ``PARAMETER`` lines (``stop``
    once per string, strings quoted)."""
    out: list[str] = []
    for key in (*SAMPLING_KEYS, "seed", "default_max_tokens"):
        value = getattr(spec, key)
        if value is None or key == "dry_sequence_breakers":
            continue
        name = _OLLAMA_NAMES.get(key, key)
        if isinstance(value, list):
            out += [f"{name} {json.dumps(v)}" for v in value]
        else:
            out.append(f"{name} {value}")
    return out


def _template(pool: ModelPool, meta: GGUFMetadata | None) -> str:
    spec = pool.spec
    if spec.chat_template:
        return spec.chat_template
    if meta is not None and meta.chat_template:
        return meta.chat_template
    user, ai = spec.user_prompt or "User: ", spec.ai_prompt or "Assistant: "
    return f"{spec.pre_prompt or ''}\n{user}{{{{ .Prompt }}}}\n{ai}".lstrip("\n")


def capabilities(pool: ModelPool, meta: GGUFMetadata | None) -> list[str]:
    """What the model can do here, as Ollama's /api/show lists it: ``embedding`` for an
    embedding model, else ``completion`` (its embeddings from a second context are not
    listed, as Ollama lists none for a generative model); ``tools`` when its template renders tools; ``insert`` where the vocabulary has
    FIM tokens and ``vision`` where it has a projector (corral.control.capabilities: a
    loaded instance says, else the file and settings); ``thinking`` when
    corral splits its reasoning (a loaded instance says; else the template and settings)."""
    spec = pool.spec
    if spec.embedding:
        return ["embedding"]
    template = spec.chat_template or (meta.chat_template if meta is not None else None)
    out = ["completion"]
    if template and "tools" in template:
        out.append("tools")
    if can(pool, "infill", meta):
        out.append("insert")
    if can(pool, "vision"):
        out.append("vision")
    if can(pool, "audio"):
        out.append("audio")
    loaded = next((i.info.reasoning_format for i in pool.instances if i.info is not None), None)
    fmt = loaded if loaded is not None else (
        f.name if (f := reasoning_format.resolve(spec.reasoning_format, template)) else "none")
    if fmt != "none":
        out.append("thinking")
    return out


@router.post("/api/show")
async def show(request: Request) -> Response:
    body = await parse_body(request, OllamaModelRequest)
    plane = plane_of(request)
    adapter: AdapterModel | None = None
    try:
        pool = plane.pool(body.model_name())
    except ModelNotFound:
        if (adapter := find_adapter_model(plane, body.model_name())) is None:
            raise
        pool = adapter.base
    (meta,) = await _metas([pool])
    spec = pool.spec
    info: dict[str, Any] = {}
    if meta is not None:
        # long arrays (the tokenizer's) are [], as Ollama shows them without verbose
        info = {k: ([] if isinstance(v, dict) else v) for k, v in meta.values.items()
                if k != "tokenizer.chat_template"}
        info["general.parameter_count"] = meta.n_params
    params = [f"num_ctx {spec.slot_ctx()}", *modelfile_parameters(spec)]
    if spec.stop is None and not (spec.chat_template or (meta and meta.chat_template)):
        params += [f'stop "{s}"' for s in ("\nUser:", "\nAssistant:")]
    template = _template(pool, meta)
    entry = _entry(pool, meta, await _store_sha(request))
    caps = capabilities(pool, meta)
    line = ""
    if adapter is not None:  # its base named: FROM it, details.parent_model; no images under an adapter
        entry, line = _adapter_entry(adapter, entry), f"ADAPTER {adapter.adapter.path}\n"
        caps = [c for c in caps if c not in ("vision", "audio")]
    system = f'SYSTEM """{spec.system}"""\n' if spec.system is not None else ""
    return json_response({
        "modelfile": f"# Modelfile generated by corral\nFROM {spec.path}\n{line}TEMPLATE \"\"\"{template}\"\"\"\n"
                     + system + "".join(f"PARAMETER {p}\n" for p in params),
        "parameters": "\n".join(params), "template": template, "details": entry["details"],
        **({"system": spec.system} if spec.system is not None else {}),
        **({"license": "\n".join(lic)} if (lic := _license(request, spec.id)) else {}),
        "model_info": info, "modified_at": entry["modified_at"],
        "capabilities": caps, **{k: entry[k] for k in ("status", "reason") if k in entry}})




# ------------------------------------------------------------------------ pull


def _progress(h: PullHandle, digest: str) -> bytes:
    return ndjson_line({"status": f"pulling {digest[7:19]}", "digest": digest, "total": h.total or 0,
                        "completed": h.done})


async def _pull_lines(q: "asyncio.Queue[Event]", h: PullHandle, first: list[bytes]) -> AsyncIterator[bytes]:
    for line in first:
        yield line
    digest = "sha256:" + (h.sha256 or hashlib.sha256(h.source.encode()).hexdigest())
    yield _progress(h, digest)
    ended = asyncio.ensure_future(h.wait())
    try:
        while not ended.done():
            get = asyncio.ensure_future(q.get())
            done, _ = await asyncio.wait({get, ended}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                break
            ev = get.result()
            if ev.get("pull_id") == h.pull_id and ev.name == "download_progress":
                yield _progress(h, digest)
        if h.state == "finished":
            yield _progress(h, digest)
            for status in ("verifying sha256 digest", "writing manifest", "success"):
                yield ndjson_line({"status": status})
        else:
            yield ndjson_line({"error": h.reason or f"pull {h.state}"})
    finally:
        ended.cancel()


@router.post("/api/pull")
async def pull(request: Request) -> Response:
    body = await parse_body(request, OllamaPullRequest)
    name = body.model_name()
    dm = downloads_of(request)
    bus = request.app.state.bus
    if dm is None:
        raise InvalidRequest("pulling is not available: this server has no models_dir store")
    stack = contextlib.AsyncExitStack()
    q = await stack.enter_async_context(bus.subscribe())
    try:
        h = await dm.start(name)
    except InvalidRequest as exc:
        await stack.aclose()
        if exc.param != "model":
            raise
        raise InvalidRequest(f"{exc.message} (corral pulls GGUF files from Hugging Face or a URL, not "
                             "from the Ollama registry)", param="model") from None
    except Conflict as exc:  # already pulled: Ollama answers a pull of a model it has with success
        await stack.aclose()
        if "already exists" not in exc.message:
            raise
        done = [{"status": "pulling manifest"}, {"status": "success"}]
        if not body.stream:
            return json_response(done[-1])
        return StreamingResponse(iter([ndjson_line(x) for x in done]), media_type="application/x-ndjson")
    except BaseException:
        await stack.aclose()
        raise
    if not body.stream:
        await stack.aclose()
        state = await h.wait()
        if state != "finished":
            raise h._error if h._error is not None else DownloadError(h.reason or f"pull {state}")
        return json_response({"status": "success"})

    async def lines() -> AsyncIterator[bytes]:
        try:
            async for line in _pull_lines(q, h, [ndjson_line({"status": "pulling manifest"})]):
                yield line
        finally:
            await stack.aclose()
    return StreamingResponse(lines(), media_type="application/x-ndjson")


# ------------------------------------------------------------------------ delete, copy


@router.delete("/api/delete")
async def delete(request: Request) -> Response:
    body = await parse_body(request, OllamaModelRequest)
    name = body.model_name()
    plane = plane_of(request)
    try:
        mid = plane.resolve(name)
    except ModelNotFound:
        mid = name
    created = created_of(request)
    if mid in plane.pools and plane.pools[mid].spec.source == "created" and created is not None:
        gone = next((r for r in created.load() if r.name == mid), None)
        created.remove(mid)
        await plane.remove_model(mid)
        if gone is not None:  # its uploads that no model runs on any more go too (Ollama prunes so)
            used = {f for r in created.load() for f in r.files()}
            used |= {str(f) for p in plane.pools.values() for f in (p.spec.path, p.spec.mmproj) if f}
            blob_store(request).remove_unused(gone.files(), used)
        return Response(status_code=200)
    store = store_of(request)
    if store is None or await asyncio.to_thread(store.get, mid) is None:
        if mid in plane.pools:
            raise InvalidRequest(f"model {mid!r} is not a pulled model ({plane.pools[mid].spec.source}); "
                                 "only models in models_dir can be deleted", param="model")
        raise ModelNotFound(f"model {name!r} not found", param="model")
    await remove_from_store(request, mid, force=True)
    return Response(status_code=200)


@router.post("/api/copy")
async def copy(request: Request) -> Response:
    body = await parse_body(request, OllamaCopyRequest)
    plane_of(request).add_alias(body.source, body.destination)
    return Response(status_code=200)
