"""Which scope each route needs: one table, decided route by route.

    public   no key at all (/health, the page's static files)
    key      any valid key (model lists, which show only the models the key may use;
             the API docs; /usage, which shows a key its own usage)
    infer    generation, embeddings, tokenizing, counting tokens
    manage   load, unload, pull, reload, copy; the metrics and the event stream
             (they name every model and key)
    admin    deleting models; every key's usage. An admin key has every scope.

``MODEL_ROUTES`` are the requests that reach a model (every ``infer`` route, GET
/tokenizer_info too): the key's limits (rpm, tpm, tpd, concurrency, queue) and its
``max_priority`` apply to those.

``RouteScopes`` finds a request's route (the app's own routes, compiled once) and
answers its scope; a route missing from ``ROUTE_SCOPES`` needs ``admin`` (closed by
default), and tests/api/test_key_scopes.py fails for it, so every new route gets a
decision here.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from starlette.routing import compile_path

__all__ = ["MODEL_ROUTES", "ROUTE_SCOPES", "RouteScopes", "Scope", "app_routes"]

Scope = Literal["public", "key", "infer", "manage", "admin"]

_INFER_POSTS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                "/v1/embeddings", "/embeddings", "/v1/messages", "/v1/messages/count_tokens",
                "/v1/responses", "/v1/responses/input_tokens", "/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
                "/tokenize", "/detokenize",
                # speech to text (api/openai/audio_routes.py): multipart forms, as OpenAI takes them
                "/v1/audio/transcriptions", "/audio/transcriptions", "/v1/audio/translations", "/audio/translations",
                # llama-server's own (api/llamacpp): infill, rerank, the chat as a template renders it
                "/infill", "/v1/rerank", "/rerank", "/v1/reranking", "/reranking", "/apply-template")

ROUTE_SCOPES: dict[tuple[str, str], Scope] = {
    ("GET", "/health"): "public",
    ("GET", "/"): "public",
    ("GET", "/ui/{name}"): "public",
    **{("POST", p): "infer" for p in _INFER_POSTS},
    ("GET", "/tokenizer_info"): "infer",  # a loaded model's tokenizer (it loads nothing: a GET)
    # a key's own stored responses (api/openai/responses.py): another key's are 404
    ("GET", "/v1/responses/{response_id}"): "infer",
    ("DELETE", "/v1/responses/{response_id}"): "infer",
    ("POST", "/v1/responses/{response_id}/cancel"): "infer",
    # a key's own streams that outlive their client (api/llamacpp/streams.py): another key's are 404
    ("GET", "/v1/stream"): "infer",
    ("DELETE", "/v1/stream"): "infer",
    ("POST", "/api/show"): "key",
    ("GET", "/v1/models"): "key",
    ("GET", "/v1/models/{model_id:path}"): "key",
    ("GET", "/models"): "key",
    ("GET", "/models/show"): "key",
    ("GET", "/models/fit"): "key",  # the fit estimate of a model the key may use (visibility applies)
    # the Hub with the server's HF token, on the server's time (api/page/hub.py): as pulls are
    ("GET", "/hub/search"): "manage",
    ("GET", "/hub/repo"): "manage",
    ("GET", "/hub/fit"): "manage",
    ("GET", "/api/tags"): "key",
    ("GET", "/api/ps"): "key",
    ("GET", "/api/version"): "key",
    ("GET", "/docs"): "key",
    ("GET", "/docs/oauth2-redirect"): "key",
    ("GET", "/openapi.json"): "key",
    ("GET", "/usage"): "key",
    ("GET", "/usage/now"): "key",  # running and queued per key now: another key's only with admin
    # the keys (api/manage/keys.py): names, scopes and limits of every key; creating and revoking them
    ("GET", "/keys"): "admin",
    ("POST", "/keys"): "admin",
    ("DELETE", "/keys/{name}"): "admin",
    ("GET", "/props"): "key",  # one model's settings (visibility applies), as /api/show
    ("GET", "/slots"): "key",  # slot counts and states, never prompts
    ("POST", "/slots/{id_slot}"): "manage",  # writes/reads the server's slot files, changes a slot's cache
    ("GET", "/lora-adapters"): "key",  # a model's adapters and their default scales, as /props
    ("POST", "/lora-adapters"): "manage",  # sets the default scales of every request to the model
    ("GET", "/stats"): "manage",
    ("GET", "/metrics"): "manage",
    ("GET", "/models/events"): "manage",
    ("GET", "/models/sse"): "manage",
    ("POST", "/models/load"): "manage",
    ("POST", "/models/unload"): "manage",
    ("POST", "/models/reload"): "manage",
    ("POST", "/models"): "manage",
    ("POST", "/models/pull"): "manage",
    ("GET", "/models/pull/{pull_id}"): "manage",
    ("DELETE", "/models/pull/{pull_id}"): "manage",
    ("POST", "/api/pull"): "manage",
    ("POST", "/api/copy"): "manage",
    ("POST", "/api/create"): "manage",  # a new model (api/ollama/create.py)
    ("POST", "/api/blobs/{digest}"): "manage",  # a file for it
    ("GET", "/api/blobs/{digest}"): "manage",  # is it here (and HEAD, as Ollama's clients ask)
    ("POST", "/inferences/llamacpp/loadmodel"): "manage",
    ("GET", "/inferences/llamacpp/unloadmodel"): "manage",
    ("POST", "/inferences/llamacpp/unloadmodel"): "manage",
    ("DELETE", "/api/delete"): "admin",
    ("DELETE", "/models/{model_id:path}"): "admin",
}

# the infer routes are those that run work on a model (and may load it): all admitted the same
# way. GET /props, /slots and /lora-adapters only read (they never load): scope "key".
MODEL_ROUTES = frozenset(route for route, scope in ROUTE_SCOPES.items() if scope == "infer")


def app_routes(routes: list[Any], prefix: str = "") -> list[tuple[str, str]]:
    """(method, path template) of every route, those of included routers too (HEAD aside)."""
    out: list[tuple[str, str]] = []
    for r in routes:
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        if inner is not None and not hasattr(r, "methods"):
            out += app_routes(inner.routes, prefix + getattr(r, "prefix", ""))
            continue
        out += [(m, prefix + r.path) for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD"]
    return out


class RouteScopes:
    """A request's (method, path) -> (its route's template or None, scope)."""

    def __init__(self, routes: list[tuple[str, str]]) -> None:
        self._exact: dict[tuple[str, str], str] = {}
        self._patterns: list[tuple[str, re.Pattern[str], str]] = []
        for method, template in routes:
            if "{" in template:
                regex, _, _ = compile_path(template)
                self._patterns.append((method, regex, template))
            else:
                self._exact[(method, template)] = template

    def route_of(self, method: str, path: str) -> str | None:
        if method == "HEAD":
            method = "GET"
        found = self._exact.get((method, path))
        if found is not None:
            return found
        for m, regex, template in self._patterns:
            if m == method and regex.match(path):
                return template
        return None

    def scope_of(self, method: str, path: str) -> tuple[str | None, Scope]:
        """The route and its scope; a path no route serves needs only a key (it is a 404)."""
        template = self.route_of(method, path)
        if template is None:
            return None, "key"
        return template, ROUTE_SCOPES.get((method if method != "HEAD" else "GET", template), "admin")
