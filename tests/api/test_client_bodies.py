"""Request bodies recorded from real clients (tests/fixtures/clients/<client>/, recorded with
a loopback capture server: see README "Clients"), replayed against a corral router with fake
workers: each is served as it comes, and what reaches the worker is what the client meant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.harness import Harness

from corral import wire
from corral.api.openai.responses_tools import Toolbox

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients"


def _body(client: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / client / name).read_text())
    body["model"] = "a"
    return body


@pytest.mark.parametrize("name", ["first_turn.json", "tool_result_turn.json"])
async def test_codex_responses_bodies_are_served(harness: Harness, name: str) -> None:
    """Codex CLI 0.171.0 (wire_api = "responses"): a ``namespace`` tool group and the hosted
    ``web_search`` tool, developer messages, ``store: false``, ``include``, streamed."""
    await harness.serve()
    c = harness.client
    body = _body("codex", name)
    async with c.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200, await r.aread()
        lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    final = events[-1]["response"]
    assert any("web_search" in w for w in final["warnings"]), final["warnings"]
    assert final["output"][-1]["content"][0]["text"] == "Hello, world!"
    seen = harness.requests_seen("a")[-1]
    names = {t["function"]["name"] for t in seen["tools"]}
    namespace = next(t for t in body["tools"] if t["type"] == "namespace")
    assert {t["name"] for t in namespace["tools"]} <= names  # the group's functions, by name
    assert "web_search" not in names
    assert seen["messages"][0]["role"] == "system"  # the developer message
    if name == "tool_result_turn.json":
        call, result = seen["messages"][-2], seen["messages"][-1]
        assert call["tool_calls"][0]["name"] == "exec_command"
        assert result["role"] == "tool" and result["tool_call_id"] == "call_1" and "hi" in result["content"]
    # stored only when asked (Codex sends store: false)
    assert (await c.get(f"/v1/responses/{final['id']}")).status_code == 404


def test_tool_calls_come_back_in_their_tools_item_types() -> None:
    tools = Toolbox([
        {"type": "namespace", "name": "multi_agent_v1", "tools": [{"type": "function", "name": "close_agent"}]},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                                                             "definition": "start: /.+/"}},
        {"type": "local_shell"}, {"type": "file_search", "vector_store_ids": []}])
    assert [f["function"]["name"] for f in tools.functions] == ["close_agent", "apply_patch", "local_shell"]
    assert "lark" in tools.functions[1]["function"]["description"]
    assert len(tools.warnings) == 1 and "file_search" in tools.warnings[0]
    item = tools.item(wire.ToolCall(id="c1", name="close_agent", arguments='{"target": "x"}'), "completed")
    assert item["type"] == "function_call" and item["namespace"] == "multi_agent_v1"
    item = tools.item(wire.ToolCall(id="c2", name="apply_patch", arguments='{"input": "*** Begin"}'), "completed")
    assert item == {"id": "ctc_c2", "type": "custom_tool_call", "status": "completed", "call_id": "c2",
                    "name": "apply_patch", "input": "*** Begin"}
    item = tools.item(wire.ToolCall(id="c3", name="local_shell", arguments='{"command": ["ls"]}'), "completed")
    assert item["type"] == "local_shell_call" and item["action"]["command"] == ["ls"]


async def test_background_response_runs_without_the_connection(harness: Harness) -> None:
    await harness.serve()
    c = harness.client
    r = await c.post("/v1/responses", json={"model": "a", "input": "hi", "background": True})
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    rid = r.json()["id"]
    while (got := (await c.get(f"/v1/responses/{rid}")).json())["status"] in ("queued", "in_progress"):
        pass
    assert got["status"] == "completed" and got["output"][0]["content"][0]["text"] == "Hello, world!"
    # a long one, cancelled
    r = await c.post("/v1/responses", json={"model": "a", "input": "FOREVER", "background": True})
    rid = r.json()["id"]
    plane = harness.plane
    while plane.pools["a"].inflight == 0:
        await c.get(f"/v1/responses/{rid}")
    r = await c.post(f"/v1/responses/{rid}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
    assert (await c.get(f"/v1/responses/{rid}")).json()["status"] == "cancelled"
    # a streamed response is stored when its stream ends
    async with c.stream("POST", "/v1/responses", json={"model": "a", "input": "hi", "stream": True}) as r:
        last = [line async for line in r.aiter_lines() if line.startswith("data: ")][-1]
    rid = json.loads(last[6:])["response"]["id"]
    assert (await c.get(f"/v1/responses/{rid}")).json()["output"][0]["content"][0]["text"] == "Hello, world!"
    r = await c.post("/v1/responses", json={"model": "a", "input": "x", "background": True, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"


def _recorded(client: str) -> list[tuple[str, dict[str, Any]]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted((FIXTURES / client).glob("*.json"))]


@pytest.mark.parametrize("client", ["litellm", "aider"])
async def test_ollama_bodies_without_a_json_content_type_are_served(harness: Harness, client: str) -> None:
    """LiteLLM 1.81.10's ``ollama/`` and ``ollama_chat/`` providers (and so aider 0.86.2) send
    JSON with no Content-Type (async: application/octet-stream); aider sends
    ``options.num_ctx`` = prompt x 1.25 + 8192, over the slot's 1,024 tokens here."""
    await harness.serve({"gemma": {"path": str(harness.script("a"))}})
    c = harness.client
    for name, rec in _recorded(client):
        headers = {"content-type": rec["content_type"]} if rec["content_type"] else {}
        content = json.dumps(rec["body"]).encode()
        r = await c.request(rec["method"], rec["path"], content=content, headers=headers)
        assert r.status_code == 200, (name, r.text)
        if rec["path"] == "/api/chat":
            last = json.loads(r.text.strip().splitlines()[-1])
            assert last["done"] is True, (name, r.text)
            if not rec["body"].get("stream", True):
                assert last["message"]["content"] == "Hello, world!"
