"""Keys and scopes: every route of the app has a scope decision, and it holds.

The routes come from the app itself (``app_routes(app.routes)``): a route added without
an entry in corral.api.route_table.ROUTES fails here. Fake workers (router logic only).
"""

from __future__ import annotations


import httpx
from support.harness import Harness, chat
from support.keys import bearer

from corral.api.route_table import app_routes
from corral.api.scopes import ROUTE_SCOPES, RouteScopes

JSON = {"content-type": "application/json"}
KEYS = {"inferrer": {"scopes": ["infer"]}, "manager": {"scopes": ["manage"]},
        "admin": {"scopes": ["admin"]}, "both": {"scopes": ["infer", "manage"]}}
# which of those keys each scope lets through (admin has every scope)
PASSES = {"public": {None, "inferrer", "manager", "admin", "both"},
          "key": {"inferrer", "manager", "admin", "both"},
          "infer": {"inferrer", "admin", "both"},
          "manage": {"manager", "admin", "both"},
          "admin": {"admin"}}


async def _status(c: httpx.AsyncClient, method: str, url: str, headers: dict[str, str]) -> tuple[int, str]:
    # streams (the event stream) are judged by their status alone
    async with c.stream(method, url, content=b"{}", headers={**JSON, **headers}) as r:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return r.status_code, ""
        await r.aread()
        return r.status_code, r.text


def _url(path: str) -> str:
    if path in ("/tokenizer_info", "/props", "/slots"):  # a model that is not there: no worker asked
        return path + "?model=no-such-model"
    if path == "/slots/{id_slot}":
        return "/slots/0?action=erase&model=no-such-model"
    return (path.replace("{model_id:path}", "no-such-model").replace("{pull_id}", "pull-x")
            .replace("{name}", "app.js").replace("{response_id}", "resp_x"))


# The decision, written out once more here (a change of scope must be made twice, on purpose).
EXPECTED = """
public  GET /health | GET / | GET /ui/{name}
key     GET /v1/models | GET /v1/models/{model_id:path} | GET /models | GET /models/show | GET /api/tags
        GET /api/ps | POST /api/show | GET /api/version | GET /docs | GET /docs/oauth2-redirect
        GET /openapi.json | GET /usage | GET /props | GET /slots | GET /lora-adapters
        GET /models/fit | GET /usage/now
infer   POST /v1/chat/completions | POST /chat/completions | POST /v1/completions | POST /completions
        POST /v1/embeddings | POST /embeddings | POST /v1/messages | POST /v1/messages/count_tokens
        POST /v1/responses | POST /api/chat | POST /api/generate | POST /api/embed | POST /api/embeddings
        POST /tokenize | POST /detokenize | GET /tokenizer_info
        POST /infill | POST /v1/rerank | POST /rerank | POST /v1/reranking | POST /reranking | POST /apply-template
        POST /v1/responses/input_tokens | GET /v1/responses/{response_id} | DELETE /v1/responses/{response_id}
        POST /v1/responses/{response_id}/cancel | GET /v1/stream | DELETE /v1/stream
        POST /v1/audio/transcriptions | POST /audio/transcriptions | POST /v1/audio/translations
        POST /audio/translations
manage  GET /stats | GET /metrics | GET /models/events | GET /models/sse | POST /models/load
        POST /models/unload | POST /models/reload | POST /models | POST /models/pull
        GET /models/pull/{pull_id} | DELETE /models/pull/{pull_id} | POST /api/pull | POST /api/copy
        POST /inferences/llamacpp/loadmodel | GET /inferences/llamacpp/unloadmodel
        POST /inferences/llamacpp/unloadmodel | POST /slots/{id_slot} | POST /lora-adapters
        GET /hub/search | GET /hub/repo | GET /hub/fit
        POST /api/create | GET /api/blobs/{digest} | POST /api/blobs/{digest}
admin   DELETE /api/delete | DELETE /models/{model_id:path} | GET /keys | POST /keys | DELETE /keys/{name}
"""


def _expected() -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    scope = ""
    for line in EXPECTED.strip().splitlines():
        if not line.startswith(" "):
            scope, line = line.split(None, 1)
        for route in line.split("|"):
            method, path = route.split()
            out[(method, path)] = scope
    return out


def test_every_route_has_a_scope_decision(harness: Harness) -> None:
    from corral.api.app import create_app

    app = create_app(harness.config({}))
    routes = set(app_routes(app.routes))
    assert ("GET", "/usage") in routes and ("POST", "/v1/chat/completions") in routes
    assert routes - set(ROUTE_SCOPES) == set(), "routes without a scope decision"
    assert set(ROUTE_SCOPES) - routes == set(), "scope decisions for routes that do not exist"
    assert dict(ROUTE_SCOPES) == _expected()
    # and an undecided route is closed: it needs admin
    scopes = RouteScopes([*routes, ("POST", "/v1/new-thing")])
    assert scopes.scope_of("POST", "/v1/new-thing") == ("/v1/new-thing", "admin")
    assert scopes.scope_of("GET", "/v1/models/a/b") == ("/v1/models/{model_id:path}", "key")
    assert scopes.scope_of("DELETE", "/models/x") == ("/models/{model_id:path}", "admin")


async def test_route_by_scope_table(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS)
    c = harness.client
    table: dict[tuple[str, str], dict[str | None, int]] = {}
    for (method, path), scope in sorted(ROUTE_SCOPES.items()):
        url = _url(path)
        row = table.setdefault((method, path), {})
        for who in (None, *KEYS):
            status, text = await _status(c, method, url, bearer(secrets[who]) if who else {})
            row[who] = status
            if who in PASSES[scope]:
                assert status not in (401, 403), (method, path, who, status, text)
            elif who is None:
                assert status == 401, (method, path, status)
            else:
                assert status == 403, (method, path, who, status)
                assert "insufficient_scope" in text or "permission_error" in text or "lacks" in text
    # the table itself, for a few routes that say what each scope is for
    assert table[("POST", "/v1/chat/completions")] == {
        None: 401, "inferrer": 400, "manager": 403, "admin": 400, "both": 400}  # 400: the body is {}
    assert table[("POST", "/models/load")][None] == 401 and table[("POST", "/models/load")]["inferrer"] == 403
    assert table[("DELETE", "/api/delete")]["manager"] == 403
    assert table[("GET", "/health")][None] == 200


async def test_scope_refusals_in_each_dialect(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS)
    c = harness.client
    h = bearer(secrets["manager"])
    r = await c.post("/v1/chat/completions", json=chat("a"), headers=h)
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
    assert "'infer'" in r.json()["error"]["message"]
    r = await c.post("/v1/messages", json={"model": "a", "max_tokens": 5,
                                           "messages": [{"role": "user", "content": "hi"}]}, headers=h)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = await c.post("/api/chat", json=chat("a"), headers=h)
    assert r.status_code == 403 and "infer" in r.json()["error"]
    # x-api-key works as Bearer does; a wrong key is 401 whatever the route's scope
    r = await c.post("/v1/chat/completions", json=chat("a"), headers={"x-api-key": secrets["inferrer"]})
    assert r.status_code == 200
    r = await c.post("/models/load", json={"model": "a"}, headers={"x-api-key": secrets["inferrer"]})
    assert r.status_code == 403
    r = await c.post("/models/load", json={"model": "a"}, headers=bearer("sk-wrong"))
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


async def test_api_key_is_one_admin_key_next_to_the_file(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS, api_key="s3cret")
    c = harness.client
    assert (await c.post("/models/load", json={"model": "a"}, headers=bearer("s3cret"))).status_code == 200
    assert (await c.get("/metrics", headers={"x-api-key": "s3cret"})).status_code == 200
    assert (await c.post("/v1/chat/completions", json=chat("a"), headers=bearer("s3cret"))).status_code == 200
    assert (await c.get("/v1/models", headers=bearer(secrets["inferrer"]))).status_code == 200
    assert (await c.get("/v1/models", headers=bearer("s3cre"))).status_code == 401


async def test_an_empty_keys_file_refuses_everyone(harness: Harness) -> None:
    await harness.serve(keys={})
    c = harness.client
    assert (await c.get("/v1/models")).status_code == 401
    assert (await c.get("/health")).status_code == 200


def test_every_infer_route_is_admitted_as_a_model_request() -> None:
    """Each route that runs work on a model (or loads it) gets the key's limits; the GETs
    that only read a model's state are not among them (they never load it)."""
    from corral.api.scopes import MODEL_ROUTES

    assert {("GET", "/tokenizer_info"), ("POST", "/v1/chat/completions"), ("POST", "/api/generate")} <= MODEL_ROUTES
    assert MODEL_ROUTES == {r for r, s in ROUTE_SCOPES.items() if s == "infer"}
    assert not {("GET", "/props"), ("GET", "/slots"), ("GET", "/lora-adapters")} & MODEL_ROUTES


async def test_keep_alive_needs_manage_and_an_open_server_keeps_it(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS)
    c = harness.client
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "stream": False, "keep_alive": -1}
    r = await c.post("/api/chat", json=body, headers=bearer(secrets["inferrer"]))
    assert r.status_code == 200 and "manage scope" in r.headers["x-corral-keep-alive-ignored"]
    assert not harness.plane.pools["a"].pinned
    r = await c.post("/api/chat", json=body, headers=bearer(secrets["both"]))
    assert r.status_code == 200 and "x-corral-keep-alive-ignored" not in r.headers
    assert harness.plane.pools["a"].pinned


async def test_without_keys_keep_alive_applies(harness: Harness) -> None:
    await harness.serve()
    c = harness.client
    r = await c.post("/api/generate", json={"model": "a", "prompt": "hi", "stream": False, "keep_alive": "-1"})
    assert r.status_code == 200 and "x-corral-keep-alive-ignored" not in r.headers
    assert harness.plane.pools["a"].pinned
