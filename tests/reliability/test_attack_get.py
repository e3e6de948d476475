"""No state change by GET (issue 45): every GET and HEAD route of the app's route table,
asked about a model that is not loaded while another is (``max_loaded_models = 1``, no key:
the default), loads, unloads, evicts and pulls nothing. An ``<img>`` tag on any web page the
user opens can send a GET; ``GET /tokenizer_info?model=X`` used to load X and evict the other.
"""

from __future__ import annotations

import pytest

from corral.api.route_table import app_routes
from corral.events import Event, EventName
from support.harness import Harness, chat

# the query every route gets: each name a route may read a model from
QUERY = {"model": "b", "name": "b", "id": "b", "model_id": "b", "conv_id": "x", "from": "0", "action": "erase"}
ENDLESS = {"/models/events", "/models/sse"}  # event streams: their status and first bytes only


def _url(path: str) -> str:
    return (path.replace("{model_id:path}", "b").replace("{pull_id}", "pull-x").replace("{name}", "app.js")
            .replace("{response_id}", "resp_x").replace("{id_slot}", "0"))


@pytest.mark.parametrize("evictor", ["b", "a"])
async def test_no_get_or_head_route_loads_unloads_or_evicts(harness: Harness, evictor: str) -> None:
    # evictor "b": every route asked about the model that is not loaded (a load would evict a);
    # "a": asked about the loaded one (an unload or a reload would show)
    await harness.start(harness.config({"a": {"path": str(harness.script("a"))},
                                        "b": {"path": str(harness.script("b"))}}, max_loaded_models=1),
                        use_store=True)
    c = harness.client
    assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200
    plane = harness.plane
    routes = sorted({p for m, p in app_routes(harness.app.routes) if m == "GET"})
    assert {"/tokenizer_info", "/props", "/slots", "/api/ps", "/v1/models", "/models/show"} <= set(routes)
    seen: list[Event] = []
    answers: dict[tuple[str, str], int] = {}
    async with plane.bus.subscribe() as q:
        for path in routes:
            for method in ("GET", "HEAD"):
                url = _url(path)
                async with c.stream(method, url, params={**QUERY, "model": evictor}) as r:
                    if path not in ENDLESS:
                        await r.aread()
                    answers[(method, path)] = r.status_code
        while not q.empty():
            seen.append(q.get_nowait())
    changes = [e for e in seen if e.name in (EventName.STATUS_CHANGE, EventName.DOWNLOAD_STARTED,
                                             EventName.MODEL_ADDED, EventName.MODEL_REMOVED)]
    assert changes == [], changes
    assert plane.pool("a").status() == "loaded" and plane.pool("b").status() == "unloaded"
    assert harness.requests_seen("b") == []
    assert all(s < 500 for s in answers.values()), {k: v for k, v in answers.items() if v >= 500}
    assert len(answers) >= 40  # the whole table was walked, both methods


async def test_tokenizer_info_of_a_model_not_loaded_says_so(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))},
                         "b": {"path": str(harness.script("b"))}}, max_loaded_models=1)
    c = harness.client
    assert (await c.post("/v1/chat/completions", json=chat("a"))).status_code == 200
    async with harness.plane.bus.subscribe() as q:
        r = await c.get("/tokenizer_info", params={"model": "b"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "model_not_loaded" and err["param"] == "model" and "POST /models/load" in err["message"]
        assert q.empty()  # the old route loaded b (and evicted a) before it answered
    assert harness.plane.pool("a").status() == "loaded" and harness.plane.pool("b").status() == "unloaded"
