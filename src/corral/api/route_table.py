"""Every route the app serves, once: (method, path template) -> what corral decided for it.

    scope   who may call it (``corral.api.scopes``: public, key, infer, manage, admin)
    hot     a POST generation route served below Starlette's routing (``corral.api.hot_routes``)

The routers declare the routes themselves (their modules under ``corral.api``); the scopes,
the hot routes and the app read this table, and ``app_routes`` / ``served`` walk the routes
the app serves. tests/api/test_key_scopes.py fails for a route
the app serves without an entry here, and for an entry no route serves, so every new route
gets its decisions here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

__all__ = ["ROUTES", "Route", "Scope", "app_routes", "served"]

Scope = Literal["public", "key", "infer", "manage", "admin"]


class Route(NamedTuple):
    scope: Scope
    hot: bool = False  # served by HotRoutes (the endpoint takes only the request)


# generation: the most frequent requests, served below the routing layers (api/hot_routes.py)
_HOT_POSTS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
              "/v1/messages", "/v1/responses", "/api/chat", "/api/generate")
_INFER_POSTS = ("/v1/embeddings", "/embeddings", "/v1/messages/count_tokens",
                "/v1/responses/input_tokens", "/api/embed", "/api/embeddings",
                "/tokenize", "/detokenize",
                # speech to text (api/openai/audio_routes.py): multipart forms, as OpenAI takes them
                "/v1/audio/transcriptions", "/audio/transcriptions", "/v1/audio/translations", "/audio/translations",
                # llama-server's own (api/llamacpp): infill, rerank, the chat as a template renders it
                "/infill", "/v1/rerank", "/rerank", "/v1/reranking", "/reranking", "/apply-template")

ROUTES: dict[tuple[str, str], Route] = {
    ("GET", "/health"): Route("public"),
    ("GET", "/"): Route("public"),
    ("GET", "/ui/{name}"): Route("public"),
    **{("POST", p): Route("infer", hot=True) for p in _HOT_POSTS},
    **{("POST", p): Route("infer") for p in _INFER_POSTS},
    ("GET", "/tokenizer_info"): Route("infer"),  # a loaded model's tokenizer (it loads nothing: a GET)
    # a key's own stored responses (api/openai/responses.py): another key's are 404
    ("GET", "/v1/responses/{response_id}"): Route("infer"),
    ("DELETE", "/v1/responses/{response_id}"): Route("infer"),
    ("POST", "/v1/responses/{response_id}/cancel"): Route("infer"),
    # a key's own streams that outlive their client (api/llamacpp/streams.py): another key's are 404
    ("GET", "/v1/stream"): Route("infer"),
    ("DELETE", "/v1/stream"): Route("infer"),
    ("POST", "/api/show"): Route("key"),
    ("GET", "/v1/models"): Route("key"),
    ("GET", "/v1/models/{model_id:path}"): Route("key"),
    ("GET", "/models"): Route("key"),
    ("GET", "/models/show"): Route("key"),
    ("GET", "/models/fit"): Route("key"),  # the fit estimate of a model the key may use (visibility applies)
    # the Hub with the server's HF token, on the server's time (api/page/hub.py): as pulls are
    ("GET", "/hub/search"): Route("manage"),
    ("GET", "/hub/repo"): Route("manage"),
    ("GET", "/hub/fit"): Route("manage"),
    ("GET", "/api/tags"): Route("key"),
    ("GET", "/api/ps"): Route("key"),
    ("GET", "/api/version"): Route("key"),
    ("GET", "/docs"): Route("key"),
    ("GET", "/docs/oauth2-redirect"): Route("key"),
    ("GET", "/openapi.json"): Route("key"),
    ("GET", "/usage"): Route("key"),
    ("GET", "/usage/now"): Route("key"),  # running and queued per key now: another key's only with admin
    # the keys (api/manage/keys.py): names, scopes and limits of every key; creating and revoking them
    ("GET", "/keys"): Route("admin"),
    ("POST", "/keys"): Route("admin"),
    ("DELETE", "/keys/{name}"): Route("admin"),
    ("GET", "/props"): Route("key"),  # one model's settings (visibility applies), as /api/show
    ("GET", "/slots"): Route("key"),  # slot counts and states, never prompts
    ("POST", "/slots/{id_slot}"): Route("manage"),  # writes/reads the server's slot files, changes a slot's cache
    ("GET", "/lora-adapters"): Route("key"),  # a model's adapters and their default scales, as /props
    ("POST", "/lora-adapters"): Route("manage"),  # sets the default scales of every request to the model
    ("GET", "/stats"): Route("manage"),
    ("GET", "/metrics"): Route("manage"),
    ("GET", "/models/events"): Route("manage"),
    ("GET", "/models/sse"): Route("manage"),
    ("POST", "/models/load"): Route("manage"),
    ("POST", "/models/unload"): Route("manage"),
    ("POST", "/models/reload"): Route("manage"),
    ("POST", "/models"): Route("manage"),
    ("POST", "/models/pull"): Route("manage"),
    ("GET", "/models/pull/{pull_id}"): Route("manage"),
    ("DELETE", "/models/pull/{pull_id}"): Route("manage"),
    ("POST", "/api/pull"): Route("manage"),
    ("POST", "/api/copy"): Route("manage"),
    ("POST", "/api/create"): Route("manage"),  # a new model (api/ollama/create.py)
    ("POST", "/api/blobs/{digest}"): Route("manage"),  # a file for it
    ("GET", "/api/blobs/{digest}"): Route("manage"),  # is it here (and HEAD, as Ollama's clients ask)
    ("POST", "/inferences/llamacpp/loadmodel"): Route("manage"),
    ("GET", "/inferences/llamacpp/unloadmodel"): Route("manage"),
    ("POST", "/inferences/llamacpp/unloadmodel"): Route("manage"),
    ("DELETE", "/api/delete"): Route("admin"),
    ("DELETE", "/models/{model_id:path}"): Route("admin"),
}


def served(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path template, route) of every route, those of included routers too."""
    for r in routes:
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        if inner is not None and not hasattr(r, "methods"):
            yield from served(inner.routes, prefix + getattr(r, "prefix", ""))
        else:
            yield prefix + r.path, r


def app_routes(routes: list[Any], prefix: str = "") -> list[tuple[str, str]]:
    """(method, path template) of every route, those of included routers too (HEAD aside)."""
    return [(m, path) for path, r in served(routes, prefix)
            for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD"]
