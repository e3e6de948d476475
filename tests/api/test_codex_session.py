"""OpenAI Codex CLI (npm ``@openai/codex`` 0.171.0, a custom provider with ``wire_api =
"responses"``) against corral: one recorded session of three turns, ``codex exec`` then
``codex exec resume --last``, the second running Codex's ``exec_command`` tool
(tests/fixtures/clients/codex/session/, recorded by the capture.py beside opencode's fixtures),
replayed against a real router, worker and the embedded model.

The bodies go as recorded, with no change: Codex sends no ``max_output_tokens``, so the model
has a ``default_max_tokens`` of a few tokens (the session was recorded with 64), and each
answer ends ``incomplete`` as it did then. The slot holds Codex's prompt (about 9,000 tokens:
its instructions and 9 tools); the model's other settings are its defaults (no ``swa_full``:
each turn continues the slot the last one left, so its prefix is still there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients" / "codex" / "session"
MODEL = "gemma-3-270m"  # the model in Codex's config.toml when the session was recorded
_DROP = {"host", "content-length", "connection", "accept-encoding"}
SESSION = ["turn1", "turn2_tool_call", "turn2_tool_result", "turn3"]


def recorded(name: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path, headers, body) of a recorded request."""
    r = json.loads((FIXTURES / f"{name}.json").read_text())
    return r["path"], {k: v for k, v in r["headers"].items() if k.lower() not in _DROP}, r["body"]


async def _replay(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """Send a recorded request as it was sent (a stream); the response its last event carries."""
    path, headers, body = recorded(name)
    assert body["stream"] is True and body["store"] is False and "max_output_tokens" not in body
    events = []
    async with c.stream("POST", path, headers=headers, content=json.dumps(body), timeout=900) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [ev["type"] for ev in events]
    assert kinds[0] == "response.created" and "error" not in kinds, kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    response: dict[str, Any] = events[-1]["response"]
    assert response["model"] == MODEL and response["id"].startswith("resp")
    assert any("web_search" in w for w in response["warnings"]), response["warnings"]
    if kinds[-1] == "response.incomplete":  # cut by the model's default_max_tokens
        assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["input_tokens"] > 0
    return response


async def test_a_codex_session_of_three_turns_with_a_tool_call(harness: Harness, model_path: Path) -> None:
    """Every request of the session answered 2xx as sent (developer messages, 9 tools with a
    ``namespace`` group and the hosted ``web_search``, ``store: false``, ``include``,
    ``reasoning``, no ``max_output_tokens``, the ``function_call`` and its
    ``function_call_output``), and each turn reuses the prompt of the turn before."""
    cfg = harness.config({MODEL: {"path": str(model_path), "ctx_len": 16384, "n_parallel": 1, "threads": 2,
                                  "default_max_tokens": 4}},
                         worker_command=None, queue_timeout_s=900.0, load_timeout_s=120.0)
    await harness.start(cfg)
    c = harness.client
    _, _, tool_turn = recorded("turn2_tool_result")
    call, result = tool_turn["input"][-2], tool_turn["input"][-1]
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    assert result["type"] == "function_call_output" and result["call_id"] == call["call_id"]
    assert "pineapple" in result["output"]

    usage = {name: (await _replay(c, name))["usage"] for name in SESSION}
    assert usage["turn1"]["input_tokens"] > 5000  # Codex's instructions and tools
    for before, turn in (("turn1", "turn2_tool_call"), ("turn2_tool_call", "turn2_tool_result"),
                         ("turn2_tool_result", "turn3")):
        cached = usage[turn]["input_tokens_details"]["cached_tokens"]
        # the whole of the turn before, up to where its answer began
        assert cached >= usage[before]["input_tokens"] - 16, (turn, cached, usage[before])
        assert cached < usage[turn]["input_tokens"]
