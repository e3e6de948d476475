"""Router logic of issue 26 with fake workers, on the bodies recorded from real clients
(tests/e2e/recorded/): what reaches the worker, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.api.core.structured import forced_call_schema
from support.harness import Harness

RECORDED = Path(__file__).parent.parent / "e2e" / "recorded"


def recorded(name: str, index: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())["requests"][index]["body"]
    body["model"] = "a"
    return body


def _params(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters) of the body's tools, in either API's shape."""
    out = []
    for t in body["tools"]:
        f = t.get("function", t)
        out.append((f["name"], f["parameters"]))
    return out


@pytest.mark.parametrize("name, path", [("openai_agents_chat", "/v1/chat/completions"),
                                        ("openai_agents_responses", "/v1/responses"),
                                        ("instructor_responses_tools", "/v1/responses")])
async def test_forced_call_with_a_format_is_constrained_by_the_call(harness: Harness, name: str, path: str) -> None:
    await harness.serve()
    body = recorded(name)
    r = await harness.client.post(path, json=body)
    assert r.status_code == 200, r.text
    (sent,) = harness.requests_seen("a")
    # the grammar is the forced call's (the tool's schema), not the format's
    assert json.loads(sent["json_schema"]) == forced_call_schema(_params(body))
    assert sent["parse_tool_calls"] is True and sent.get("grammar") is None


async def test_format_still_checked_and_raw_constraints_still_exclusive(harness: Harness) -> None:
    await harness.serve()
    body = recorded("openai_agents_chat")
    bad = json.loads(json.dumps(body))
    bad["response_format"]["json_schema"]["schema"]["properties"]["temperature_c"]["minimum"] = 0
    r = await harness.client.post("/v1/chat/completions", json=bad)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema.properties.temperature_c.minimum"
    for extra in ({"grammar": "root ::= \"x\""}, {"json_schema": {"type": "object"}}):
        r = await harness.client.post("/v1/chat/completions", json={**body, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] in ("response_format", "tool_choice"), r.text
    assert harness.requests_seen("a") == []
    # without a forced call the format is what constrains
    after_tool = recorded("openai_agents_chat", 1)
    r = await harness.client.post("/v1/chat/completions", json=after_tool)
    assert r.status_code == 200, r.text
    (sent,) = harness.requests_seen("a")
    assert json.loads(sent["json_schema"]) == after_tool["response_format"]["json_schema"]["schema"]


async def test_anthropic_output_config_becomes_the_schema(harness: Harness) -> None:
    await harness.serve()
    for name in ("anthropic_output_config", "anthropic_parse"):
        body = recorded(name)
        r = await harness.client.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        sent = harness.requests_seen("a")[-1]
        assert json.loads(sent["json_schema"]) == body["output_config"]["format"]["schema"]
    # the structured-outputs beta's spelling, and count_tokens, take it too
    beta = {**recorded("anthropic_output_config")}
    beta["output_format"] = beta.pop("output_config")["format"]
    r = await harness.client.post("/v1/messages", json=beta)
    assert r.status_code == 200, r.text
    assert json.loads(harness.requests_seen("a")[-1]["json_schema"]) == beta["output_format"]["schema"]


@pytest.mark.parametrize("extra, param", [
    ({"container": "c1"}, "container"),
    ({"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1", "name": "x"}]}, "mcp_servers"),
    ({"context_management": {"edits": [{"type": "clear_everything_20990101"}]}}, "context_management"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "integer", "minimum": 0}}}},
     "response_format.json_schema.schema.minimum"),
])
async def test_anthropic_refuses_what_it_cannot_honour(harness: Harness, extra: dict[str, Any], param: str) -> None:
    await harness.serve()
    base = {"model": "a", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = await harness.client.post(path, json={**base, **extra})
        assert r.status_code == 400, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert param.split(".")[0] in err["error"]["message"] or param in err["error"]["message"], err
    assert harness.requests_seen("a") == []


async def test_anthropic_accepts_descriptive_fields(harness: Harness) -> None:
    await harness.serve()
    body = {"model": "a", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"user_id": "u"}, "service_tier": "auto", "inference_geo": "eu", "speed": "standard",
            "cache_control": {"type": "ephemeral"}, "user_profile_id": "p", "workspace_id": "w"}
    r = await harness.client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert len(harness.requests_seen("a")) == 1


async def test_a_format_without_a_forced_call_is_not_parsed_as_calls(harness: Harness) -> None:
    await harness.serve()
    body = recorded("openai_agents_named_output")
    r = await harness.client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    (sent,) = harness.requests_seen("a")
    assert json.loads(sent["json_schema"]) == body["text"]["format"]["schema"]
    assert sent.get("parse_tool_calls", False) is False and sent["tools"]  # the template still sees the tools
    # tools without a format: calls are parsed as before
    plain = {k: v for k, v in body.items() if k != "text"}
    assert (await harness.client.post("/v1/responses", json=plain)).status_code == 200
    assert harness.requests_seen("a")[-1]["parse_tool_calls"] is True


async def test_anthropic_output_config_with_a_forced_tool(harness: Harness) -> None:
    await harness.serve()
    body = recorded("anthropic_output_config")
    tool = {"name": "get_temperature", "description": "The temperature in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    r = await harness.client.post("/v1/messages", json={**body, "tools": [tool], "tool_choice": {"type": "any"}})
    assert r.status_code == 200, r.text
    (sent,) = harness.requests_seen("a")
    assert json.loads(sent["json_schema"]) == forced_call_schema([("get_temperature", tool["input_schema"])])
