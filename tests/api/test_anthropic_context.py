"""Router logic of the Messages API's agent fields (issue 35) with fake workers: what of
Claude Code's recorded bodies (tests/fixtures/clients/claude_code/) reaches the worker,
thinking and effort as reasoning fields, and context_management's edits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.api.anthropic.context_edits import CLEARED_TOOL_RESULT
from support.harness import Harness

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients" / "claude_code"


def _recorded(name: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    r = json.loads((FIXTURES / f"{name}.json").read_text())
    headers = {k: v for k, v in r["headers"].items() if k.lower() not in ("host", "content-length", "connection")}
    return r["path"], headers, {**r["body"], "model": "a"}


async def test_claude_code_body_reaches_the_worker(harness: Harness) -> None:
    await harness.serve()
    path, headers, body = _recorded("session_b_tool_result")
    r = await harness.client.post(path, headers=headers, content=json.dumps({**body, "stream": False}))
    assert r.status_code == 200, r.text
    assert r.json()["context_management"] == {"applied_edits": []}
    (sent,) = harness.requests_seen("a")
    roles = [m["role"] for m in sent["messages"]]
    assert roles == ["system", "user", "system", "assistant", "tool"]  # the mid-conversation system stays
    system = sent["messages"][0]["content"]
    assert system.startswith("You are a Claude agent") and "x-anthropic-billing-header" not in system
    assert sent["messages"][2]["content"].startswith("Available agent types")
    # adaptive thinking at effort high: the model's default with the level's budget, optional
    assert (sent.get("think"), sent["reasoning_effort"], sent["thinking_optional"]) == (None, "high", True)
    assert len(sent["tools"]) == len(body["tools"])


async def test_thinking_forms_become_reasoning_fields(harness: Harness) -> None:
    await harness.serve()
    base = {"model": "a", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
    cases = [({"thinking": {"type": "enabled", "budget_tokens": 31999}}, (True, 31999, None)),
             ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, (None, None, None)),
             ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, (None, None, "low")),
             ({"thinking": {"type": "disabled"}, "output_config": {"effort": "low"}}, (False, None, None)),
             ({"output_config": {"effort": "medium"}}, (False, None, None))]
    for extra, want in cases:
        r = await harness.client.post("/v1/messages", json={**base, **extra})
        assert r.status_code == 200, r.text
        sent = harness.requests_seen("a")[-1]
        assert (sent.get("think"), sent.get("thinking_budget"), sent.get("reasoning_effort")) == want, extra
        assert sent.get("thinking_optional", False) is (want[0] is not False)
    r = await harness.client.post("/v1/messages", json={**base, "max_tokens": 100,
                                                         "thinking": {"type": "enabled", "budget_tokens": 100}})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]


def _tool_turns(n: int) -> list[dict[str, Any]]:
    """A conversation of n Read calls and their results (result i: 400 bytes of "i")."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for i in range(n):
        name = "Bash" if i == 0 else "Read"
        out.append({"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"thought {i}", "signature": "s"},
            {"type": "tool_use", "id": f"t{i}", "name": name, "input": {"file_path": f"/f{i}"}}]})
        out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}",
                                                 "content": str(i) * 400}]})
    return out


async def test_context_edits_clear_old_tool_results_and_thinking(harness: Harness) -> None:
    await harness.serve()
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in ("Read", "Bash")]
    body = {"model": "a", "max_tokens": 8, "tools": tools, "messages": _tool_turns(5), "context_management": {
        "edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
                  {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3},
                   "keep": {"type": "tool_uses", "value": 2}, "exclude_tools": ["Bash"], "clear_tool_inputs": True},
                  {"type": "compact_20260112"}]}}
    r = await harness.client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["context_management"] == {"applied_edits": [
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 3, "cleared_input_tokens": 6},
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 2 * (100 - len(CLEARED_TOOL_RESULT) // 4 + len('{"file_path": "/f1"}') // 4)}]}
    sent = harness.requests_seen("a")[-1]["messages"]
    results = [m["content"] for m in sent if m["role"] == "tool"]
    # t0 is Bash (excluded), t1 and t2 cleared, the last two kept
    assert results == ["0" * 400, CLEARED_TOOL_RESULT, CLEARED_TOOL_RESULT, "3" * 400, "4" * 400]
    calls = [m["tool_calls"][0]["arguments"] for m in sent if m.get("tool_calls")]
    assert [json.loads(a) for a in calls] == [{"file_path": "/f0"}, {}, {}, {"file_path": "/f3"},
                                              {"file_path": "/f4"}]
    thoughts = [m.get("reasoning") for m in sent if m["role"] == "assistant"]
    assert thoughts == [None, None, None, "thought 3", "thought 4"]
    # under the trigger, or short of clear_at_least: nothing cleared
    for edit in ({"type": "clear_tool_uses_20250919"},  # the default trigger: 100,000 input tokens
                 {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
                  "clear_at_least": {"type": "input_tokens", "value": 10_000}}):
        r = await harness.client.post("/v1/messages", json={**body, "context_management": {"edits": [edit]}})
        assert r.status_code == 200 and r.json()["context_management"] == {"applied_edits": []}, r.text
        assert CLEARED_TOOL_RESULT not in json.dumps(harness.requests_seen("a")[-1]["messages"])
