"""Claude Code (``@anthropic-ai/claude-code`` 2.1.197) against corral: one recorded session of
three turns, ``claude -p`` then ``claude -p --continue`` twice, the second running Claude
Code's ``Bash`` tool (tests/fixtures/clients/claude_code/session3/, recorded by the capture.py
beside opencode's fixtures in front of a real ``corral serve``), replayed against a real
router, worker and the embedded model.

Every request goes as recorded, headers and body, in the order Claude Code sent it: the
``HEAD /`` it probes its base URL with before each turn, and each ``POST /v1/messages`` (with
the retries it sent when an answer hit its 64-token cap) with one change: ``max_tokens``
4 instead of 64, to keep the test short. The model's context holds the 20k-token prompt, with
``swa_full`` as in test_claude_code.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients" / "claude_code" / "session3"
MODEL = "gemma-3-270m"  # ANTHROPIC_MODEL when the session was recorded
_DROP = {"host", "content-length", "connection", "accept-encoding"}
SESSION = ["turn1_head", "turn1", "turn1_resume1", "turn1_resume2", "turn1_resume3",
           "turn2_head", "turn2_tool_call", "turn2_tool_result",
           "turn3_head", "turn3", "turn3_resume1", "turn3_resume2", "turn3_resume3"]


def recorded(name: str) -> tuple[str, str, dict[str, str], Any]:
    """(method, path with its query (``?beta=true``), headers, body) of a recorded request."""
    r = json.loads((FIXTURES / f"{name}.json").read_text())
    headers = {k: v for k, v in r["headers"].items() if k.lower() not in _DROP}
    path = r["path"] + (f"?{r['query']}" if r["query"] else "")
    return r["method"], path, headers, r["body"]


def _prompt(usage: dict[str, int]) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]


async def _replay(c: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    """Send a recorded request as it was sent; for a message, the usage of its final
    message_delta, the events checked in Anthropic's order."""
    method, path, headers, body = recorded(name)
    if method == "HEAD":
        r = await c.head(path, headers=headers)
        assert r.status_code == 200, (name, r.status_code)
        return None
    assert body["stream"] is True and body["model"] == MODEL
    events: list[tuple[str, dict[str, Any]]] = []
    content = json.dumps({**body, "max_tokens": 4})
    async with c.stream(method, path, headers=headers, content=content, timeout=900) as r:
        assert r.status_code == 200, (name, await r.aread())
        assert r.headers["content-type"].startswith("text/event-stream")
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                events.append((event, json.loads(line[6:])))
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], (name, names)
    assert "error" not in names, (name, events)
    assert events[0][1]["message"]["model"] == MODEL
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use"), (name, delta)
    usage: dict[str, Any] = delta["usage"]
    return usage


async def test_a_claude_code_session_of_three_turns_with_a_tool_call(harness: Harness, model_path: Path) -> None:
    """Every request Claude Code sent in the session answered 2xx as sent (its ``HEAD /``
    probe, 24 tools, mid-conversation system messages, adaptive thinking, effort,
    context_management, anthropic-beta, the Bash ``tool_use`` and its ``tool_result``), and
    each request after the first reuses the prompt before it (``cache_read_input_tokens``)."""
    cfg = harness.config({MODEL: {"path": str(model_path), "ctx_len": 32768, "n_parallel": 1, "threads": 2,
                                  "swa_full": True, "prompt_cache_ram": 0}},
                         worker_command=None, queue_timeout_s=900.0, load_timeout_s=120.0,
                         state_dir=str(harness.tmp / "state"))  # its own prompt cache: none of another test's
    await harness.start(cfg)
    c = harness.client
    _, _, _, tool_turn = recorded("turn2_tool_result")
    call, result = tool_turn["messages"][-2]["content"][0], tool_turn["messages"][-1]["content"][0]
    assert call["type"] == "tool_use" and call["name"] == "Bash" and call["input"] == {"command": "cat notes.txt"}
    assert result["type"] == "tool_result" and result["tool_use_id"] == call["id"]
    assert "pineapple" in result["content"]

    usage = {}
    for name in SESSION:
        u = await _replay(c, name)
        if u is not None:
            usage[name] = u
    first = usage.pop("turn1")
    assert _prompt(first) > 15_000 and first["cache_creation_input_tokens"] > 15_000  # tools and system text
    for name, u in usage.items():
        # the tools, the system text and the conversation so far, short of the last answer
        assert u["cache_read_input_tokens"] > 0.9 * _prompt(u), (name, u)
        assert u["cache_read_input_tokens"] >= _prompt(first) - 64, (name, u, first)
