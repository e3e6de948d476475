"""opencode (npm ``opencode-ai`` 1.18.33, an ``@ai-sdk/openai-compatible`` provider) against
corral: one recorded session of three turns, the second using opencode's ``read`` tool
(tests/fixtures/clients/opencode/, recorded by capture.py there), replayed against a real
router, worker and the embedded model.

The one change to a body is ``max_tokens`` (opencode asks 32,000; the tests need a few
tokens). The model runs with a slot that holds opencode's prompt (about 7,000 tokens: its
system prompt and 10 tools) and ``swa_full``, so that a turn can reuse the last one's prefix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients" / "opencode"
MODEL = "gemma-3-270m"  # the model's id in opencode.json when the session was recorded
_DROP = {"host", "content-length", "connection", "accept-encoding"}
SESSION = ["title", "turn1", "turn2_tool_call", "turn2_tool_result", "turn3"]


def recorded(name: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path, headers, body) of a recorded request."""
    r = json.loads((FIXTURES / f"{name}.json").read_text())
    return r["path"], {k: v for k, v in r["headers"].items() if k.lower() not in _DROP}, r["body"]


async def _replay(c: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """Send a recorded request as a stream; the usage of its last chunk (``include_usage``)."""
    path, headers, body = recorded(name)
    assert body["max_tokens"] == 32000 and body["stream_options"] == {"include_usage": True}
    chunks = []
    async with c.stream("POST", path, headers=headers, content=json.dumps({**body, "max_tokens": 4}),
                        timeout=900) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks and all("error" not in ch for ch in chunks), chunks
    assert chunks[0]["model"] == MODEL and chunks[0]["id"].startswith("chatcmpl")
    finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    assert finishes[-1] in ("stop", "length", "tool_calls")
    usage: dict[str, Any] = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["prompt_tokens"] > 0
    return usage


async def test_an_opencode_session_of_three_turns_with_a_tool_call(harness: Harness, model_path: Path) -> None:
    """Every request of the session answered 2xx as sent (its system prompt, 10 tools,
    ``tool_choice: "auto"``, ``max_tokens`` over the slot's context, the tool call and its
    ``role: "tool"`` result), and each turn reuses the prompt of the turn before."""
    cfg = harness.config({MODEL: {"path": str(model_path), "ctx_len": 16384, "n_parallel": 1, "threads": 2,
                                  "swa_full": True}},
                         worker_command=None, queue_timeout_s=900.0, load_timeout_s=120.0)
    await harness.start(cfg)
    c = harness.client
    _, _, tool_turn = recorded("turn2_tool_result")
    call, result = tool_turn["messages"][-2], tool_turn["messages"][-1]
    assert call["tool_calls"][0]["function"]["name"] == "read" and result["role"] == "tool"
    assert "pineapple" in result["content"]

    usage = {name: await _replay(c, name) for name in SESSION}
    first = usage["turn1"]
    assert first["prompt_tokens"] > 5000  # opencode's system prompt and tools
    for before, turn in (("turn1", "turn2_tool_call"), ("turn2_tool_call", "turn2_tool_result"),
                         ("turn2_tool_result", "turn3")):
        cached = usage[turn]["prompt_tokens_details"]["cached_tokens"]
        # the whole of the turn before, up to where its answer began
        assert cached >= usage[before]["prompt_tokens"] - 16, (turn, cached, usage[before])
        assert cached < usage[turn]["prompt_tokens"]
