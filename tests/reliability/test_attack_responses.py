"""Stored responses across keys: a response id is no capability. Another key that has the id
gets the same 404 as for an id that never existed, on GET, DELETE, cancel and as
previous_response_id; the owner still has it, also after a restart; the file is 0600."""

from __future__ import annotations

import stat

from support.harness import Harness
from support.keys import bearer

from corral.api.openai.responses_store import RESPONSES_DB


KEYS = {"alice": {"scopes": ["infer"]}, "mallory": {"scopes": ["infer"]}}


async def test_another_keys_response_id_is_404(harness: Harness) -> None:
    secrets = await harness.serve(keys=KEYS, state_dir=str(harness.tmp / "state"))
    c = harness.client
    alice, mallory = bearer(secrets["alice"]), bearer(secrets["mallory"])
    r = await c.post("/v1/responses", json={"model": "a", "input": "SECRET plan"}, headers=alice)
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    answer = r.json()["output"][0]["content"][0]["text"]

    unknown = await c.get("/v1/responses/resp_never", headers=mallory)
    assert unknown.status_code == 404
    for method, url in (("GET", f"/v1/responses/{rid}"), ("DELETE", f"/v1/responses/{rid}"),
                        ("POST", f"/v1/responses/{rid}/cancel")):
        r = await c.request(method, url, headers=mallory)
        assert r.status_code == 404, (method, r.text)
        assert "SECRET" not in r.text and answer not in r.text
        assert r.json()["error"]["code"] == unknown.json()["error"]["code"]
    r = await c.post("/v1/responses", json={"model": "a", "input": "what did I say?", "previous_response_id": rid},
                     headers=mallory)
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id", r.text
    assert not any("SECRET" in str(req.get("messages")) for req in harness.requests_seen("a")[1:])

    # the owner still has it (mallory's DELETE did nothing), and can continue it
    r = await c.get(f"/v1/responses/{rid}", headers=alice)
    assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == answer
    r = await c.post("/v1/responses", json={"model": "a", "input": "more", "previous_response_id": rid},
                     headers=alice)
    assert r.status_code == 200, r.text
    assert "SECRET plan" in str(harness.requests_seen("a")[-1]["messages"])
    db = harness.tmp / "state" / RESPONSES_DB
    assert stat.S_IMODE(db.stat().st_mode) == 0o600

    # across a restart: still alice's, still nobody else's
    await harness.stop()
    await harness.serve(
        {"a": {"path": str(harness.script("a"))}}, keys_file=str(harness.tmp / "keys.toml"),
        state_dir=str(harness.tmp / "state"))
    c = harness.client
    assert (await c.get(f"/v1/responses/{rid}", headers=alice)).json()["id"] == rid
    assert (await c.get(f"/v1/responses/{rid}", headers=mallory)).status_code == 404
    assert (await c.delete(f"/v1/responses/{rid}", headers=alice)).json()["deleted"] is True
    assert (await c.get(f"/v1/responses/{rid}", headers=alice)).status_code == 404
