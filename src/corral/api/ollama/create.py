"""Ollama's create: ``HEAD``/``POST /api/blobs/:digest`` (upload a GGUF or an adapter,
checked against its digest: corral.store.blobs) and ``POST /api/create``.

``/api/create`` makes a model ``FROM`` an existing one (``from``) or from uploaded files
(``files``: {name: digest}, the ``.gguf`` and an ``mmproj`` one), with ``adapters`` (LoRA
blobs), ``system``, ``parameters`` (Ollama's option names -> generation defaults and a few
load settings), ``template`` (a Jinja chat template; Ollama's Go templates are refused,
corral cannot render them), ``messages`` (an opening conversation) and ``license``. All of
it is checked before anything changes: a bad request is a 4xx and nothing is created; then
the record is kept (corral.control.created_models), the model joins the catalog (source
``created``) and Ollama's status lines stream (``{"status": "success"}`` last; one line with
``stream: false``). ``quantize`` is refused (corral does not requantize).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import State
from starlette.responses import Response, StreamingResponse

from corral.api.core.schemas import parse_body
from corral.api.http import created_of, json_response, ndjson_line, plane_of, store_of
from corral.control.catalog import ModelSpec
from corral.config.modelfile import PARAMETERS
from corral.control.created_models import CreatedModel, CreatedModels
from corral.errors import Conflict, InvalidRequest, ModelNotFound, NotFound, UnsupportedOption
from corral.model.ids import id_problem
from corral.model.settings import LoraAdapter, ModelSettings, SettingsError
from corral.state.paths import state_dir
from corral.store.blobs import BlobStore, parse_digest
from corral.store.local import default_models_dir

__all__ = ["router", "open_created", "created_models", "spec_of", "blob_store"]

router = APIRouter()

SOURCE = "created"


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(None, min_length=1, max_length=256)
    name: str | None = Field(None, min_length=1, max_length=256)  # older clients
    from_: str | None = Field(None, alias="from", min_length=1, max_length=1024)
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    template: str | None = Field(None, max_length=1 << 20)
    license: str | list[str] | None = None
    system: str | None = Field(None, max_length=1 << 20)
    parameters: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None
    quantize: str | None = None
    stream: bool = True




def open_created(app_state: State, configured_dir: Path | None) -> None:
    """Called by the app's lifespan: the created models' file in ``state_dir``."""
    app_state.created = CreatedModels(state_dir(configured_dir))


def created_models(request: Request) -> CreatedModels | None:
    created = created_of(request)
    return created


def blob_store(request: Request) -> BlobStore:
    store = store_of(request)
    root = store.root if store is not None else (plane_of(request).config.server.models_dir or default_models_dir())
    return BlobStore(root)


# ------------------------------------------------------------------------ blobs


@router.get("/api/blobs/{digest}")
@router.head("/api/blobs/{digest}", include_in_schema=False)
async def blob_exists(request: Request, digest: str) -> Response:
    return Response(status_code=200 if blob_store(request).has(digest) else 404)


@router.post("/api/blobs/{digest}", status_code=201)
async def blob_upload(request: Request, digest: str) -> Response:
    parse_digest(digest)  # a bad digest is a 400 before any byte is read
    limit = plane_of(request).config.server.max_upload_bytes
    await blob_store(request).write(digest, request.stream(), limit=limit)
    return Response(status_code=201)


# ------------------------------------------------------------------------ create


def _param_value(key: str, value: Any, n_parallel: int) -> tuple[str, Any] | None:
    target = PARAMETERS.get(key)
    if target is None:
        raise InvalidRequest(f"parameters.{key}: not a parameter corral can honour (it takes "
                             f"{', '.join(sorted(PARAMETERS))})", param=f"parameters.{key}")
    if key == "stop":
        return target, [value] if isinstance(value, str) else value
    if key == "num_predict":
        return None if isinstance(value, int) and value < 0 else (target, value)
    if key == "num_ctx" and isinstance(value, int) and not isinstance(value, bool):
        return target, value * n_parallel  # Ollama's num_ctx is one sequence's
    if key == "seed" and isinstance(value, int) and value < 0:
        return None
    return target, value


def _template(text: str) -> str:
    if "{%" not in text and re.search(r"\{\{-?\s*(\.|if |range |end)", text):
        raise UnsupportedOption("template: this is an Ollama (Go) template, which corral cannot render; give "
                                "a Jinja chat template, or leave TEMPLATE out to use the model's own",
                                param="template")
    return text


def _gguf(path: Path, what: str) -> None:
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise InvalidRequest(f"{what}: the blob is not a GGUF file", param=what)
    except OSError:
        raise InvalidRequest(f"{what}: the blob cannot be read", param=what) from None


def _blob_path(blobs: BlobStore, digest: str, what: str) -> Path:
    path = blobs.path(digest)
    if not path.is_file():
        raise InvalidRequest(f"{what}: blob {digest} is not here; upload it first (POST /api/blobs/{digest})",
                             param=what)
    return path


def spec_of(rec: CreatedModel) -> ModelSpec:
    return ModelSpec.make(rec.name, Path(rec.path), rec.model_settings(), source=SOURCE,
                          projector=Path(rec.mmproj) if rec.mmproj else None)


def _record(request: Request, body: CreateBody, name: str) -> CreatedModel:
    """The model the body describes, checked whole (4xx for anything wrong)."""
    plane = plane_of(request)
    blobs = blob_store(request)
    base: ModelSettings
    mmproj: str | None = None
    parent: str | None = None
    if body.from_ is not None and body.files:
        raise InvalidRequest("give from or files, not both", param="from")
    if body.from_ is not None:
        try:
            pool = plane.pool(body.from_)
        except ModelNotFound:
            raise ModelNotFound(f"from: model {body.from_!r} not found (GET /api/tags lists them)",
                                param="from") from None
        base, path, parent = pool.spec.settings(), pool.spec.path, pool.spec.id
        mmproj = pool.spec.mmproj
    elif body.files:
        models = [(n, d) for n, d in body.files.items() if n.lower().endswith(".gguf") and "mmproj" not in n.lower()]
        projs = [(n, d) for n, d in body.files.items() if "mmproj" in n.lower()]
        if len(models) != 1 or len(projs) > 1 or len(body.files) != len(models) + len(projs):
            raise InvalidRequest("files: give one .gguf model file (and at most one mmproj file)", param="files")
        path = _blob_path(blobs, models[0][1], "files")
        _gguf(path, "files")
        if projs:
            proj = _blob_path(blobs, projs[0][1], "files")
            _gguf(proj, "files")
            mmproj = str(proj)
        base = plane.config.inherited_settings()
    else:
        raise InvalidRequest("from or files is required (the model to start from)", param="from")
    settings: dict[str, Any] = {}
    for key, value in (body.parameters or {}).items():
        got = _param_value(key, value, base.slots_asked() or 1)  # "auto": ctx_len is one slot's
        if got is not None:
            settings[got[0]] = got[1]
    if body.system is not None:
        settings["system"] = body.system
    if body.template is not None:
        settings["chat_template"] = _template(body.template)
    if body.messages:
        settings["messages"] = [{"role": m.get("role"), "content": m.get("content")} for m in body.messages]
    if body.adapters:
        loras = [msgspec.to_builtins(a) for a in base.lora]
        for i, (aname, digest) in enumerate(body.adapters.items()):
            apath = _blob_path(blobs, digest, "adapters")
            _gguf(apath, "adapters")
            aid = re.sub(r"[^A-Za-z0-9._-]", "-", Path(aname).stem)[:60].strip("-.") or f"adapter{i}"
            loras.append(msgspec.to_builtins(LoraAdapter(id=aid, path=str(apath))))
        settings["lora"] = loras
    try:
        checked = ModelSettings.check_partial(settings)
        own = {**msgspec.to_builtins(base.to_dict()), **msgspec.to_builtins(checked)}
        rec = CreatedModel(name=name, path=str(path), settings=own, parent=parent,
                           license=[body.license] if isinstance(body.license, str) else list(body.license or []),
                           mmproj=mmproj)
        rec.model_settings()
    except SettingsError as exc:
        key, msg = exc.errors[0]
        back = {v: k for k, v in PARAMETERS.items()}.get(key, key)
        where = f"parameters.{back}" if back in PARAMETERS else key
        raise InvalidRequest(f"{where}: {msg}", param=where) from None
    return rec


@router.post("/api/create")
async def create(request: Request) -> Response:
    body = await parse_body(request, CreateBody)
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model: required field is missing (the new model's name)", param="model")
    problem = id_problem(name)
    if problem is not None:
        raise InvalidRequest(f"model: invalid model name {name!r}: {problem}", param="model")
    if body.quantize:
        raise UnsupportedOption("quantize: corral does not quantize models; create from a quantized GGUF",
                                param="quantize")
    plane = plane_of(request)
    created = created_models(request)
    if created is None:
        raise NotFound("creating models needs the server's state directory")
    existing = plane.pools.get(name)
    if existing is not None and existing.spec.source != SOURCE:
        raise Conflict(f"model: {name!r} is already a model ({existing.spec.source}); choose another name",
                       param="model")
    plane.sync.check_new_name(name, "model")
    rec = _record(request, body, name)
    spec = spec_of(rec)
    created.put(rec)
    try:
        await plane.add_model(spec, replace=True)
    except BaseException:
        created.remove(name)
        raise
    steps = ["parsing modelfile", *(f"using existing layer sha256:{parse_digest(d)}"
                                    for d in [*(body.files or {}).values(), *(body.adapters or {}).values()]),
             "writing manifest", "success"]
    if not body.stream:
        return json_response({"status": "success"})

    async def lines() -> AsyncIterator[bytes]:
        for s in steps:
            yield ndjson_line({"status": s})

    return StreamingResponse(lines(), media_type="application/x-ndjson")
