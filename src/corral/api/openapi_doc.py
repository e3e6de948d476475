"""The request bodies in the OpenAPI document (``/openapi.json``, ``/docs``).

Routes read their bodies themselves (one ``parse_body`` per request, 400s naming the
field), so FastAPI cannot see them; this adds each body's JSON schema to its operation.
Clients, ``/docs`` and the reliability suite's schemathesis fuzzing read them from
there. A new route with a JSON body adds its ``(method, path): Model`` to ``BODIES``.

Every client reads the document, so it holds only text meant for clients: a field's
``Field(description=...)`` and a route's ``summary=`` (else FastAPI's from its name).
FastAPI and pydantic take an operation's and a model's description from their docstrings,
which are for the code's readers: those are left out (``_for_clients``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from corral.api.core.chat_request import ChatCompletionRequest
from corral.api.core.schemas import (CompletionRequest, EmbeddingRequest, ModelRef, NitroLoadModel,
                                NitroUnloadModel)

__all__ = ["BODIES", "document_request_bodies"]

BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/v1/chat/completions"): ChatCompletionRequest,
    ("post", "/v1/completions"): CompletionRequest,
    ("post", "/v1/embeddings"): EmbeddingRequest,
    ("post", "/models/load"): ModelRef,
    ("post", "/models/unload"): ModelRef,
    ("post", "/inferences/llamacpp/loadmodel"): NitroLoadModel,
    ("post", "/inferences/llamacpp/unloadmodel"): NitroUnloadModel,
}


def _with_bodies(schema: dict[str, Any], bodies: dict[tuple[str, str], type[BaseModel]]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for (method, path), model in bodies.items():
        op = schema.get("paths", {}).get(path, {}).get(method)
        if op is None:
            continue
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(js.pop("$defs", {}))
        components[model.__name__] = js
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
    return schema


def _for_clients(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without the descriptions FastAPI and pydantic take from docstrings: every
    operation's (its endpoint's docstring) and every component's own (its class docstring)."""
    for ops in schema.get("paths", {}).values():
        for op in ops.values():
            if isinstance(op, dict):
                op.pop("description", None)
    for component in schema.get("components", {}).get("schemas", {}).values():
        component.pop("description", None)
    return schema


def document_request_bodies(app: FastAPI, extra: dict[tuple[str, str], type[BaseModel]] | None = None) -> None:
    bodies = {**BODIES, **(extra or {})}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _for_clients(_with_bodies(
                get_openapi(title=app.title, version=app.version, routes=app.routes), bodies))
        return app.openapi_schema

    setattr(app, "openapi", openapi)  # FastAPI's documented way to customize the schema
