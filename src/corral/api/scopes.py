"""Which scope each route needs, decided route by route (in ``corral.api.route_table``).

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
answers its scope: the route's in ``corral.api.route_table.ROUTES`` (``ROUTE_SCOPES``); a
route missing there needs ``admin`` (closed by default), and tests/api/test_key_scopes.py
fails for it, so every new route gets a decision there.
"""

from __future__ import annotations

import re

from starlette.routing import compile_path

from corral.api.route_table import ROUTES, Scope

__all__ = ["MODEL_ROUTES", "ROUTE_SCOPES", "RouteScopes", "Scope"]

ROUTE_SCOPES: dict[tuple[str, str], Scope] = {key: route.scope for key, route in ROUTES.items()}

# the infer routes are those that run work on a model (and may load it): all admitted the same
# way. GET /props, /slots and /lora-adapters only read (they never load): scope "key".
MODEL_ROUTES = frozenset(route for route, scope in ROUTE_SCOPES.items() if scope == "infer")


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
