"""Claude Code (``@anthropic-ai/claude-code`` 2.1.197) against corral: its recorded request
bodies and headers (tests/fixtures/clients/claude_code/, recorded by capture.py there)
replayed against a real router, worker and the embedded model.

The one change to a body is ``max_tokens`` (Claude Code asks 32,000; the tests need a few
tokens). The model runs with a context that holds Claude Code's prompt (19k-28k tokens) and
``swa_full`` (Gemma 3's sliding-window layers keep every position, so a prefix shorter than
the slot's sequence can be reused: docs/internals/prompt-cache.md): about 600 MiB of KV.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.api.anthropic.schemas import AnthropicMessagesRequest
from support.harness import Harness

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients" / "claude_code"
MODEL = "gemma-3-270m"  # ANTHROPIC_MODEL when the bodies were recorded
_DROP = {"host", "content-length", "connection", "accept-encoding"}


def recorded(name: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(path, headers, body) of a recorded request."""
    r = json.loads((FIXTURES / f"{name}.json").read_text())
    return r["path"], {k: v for k, v in r["headers"].items() if k.lower() not in _DROP}, r["body"]


def sse(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def _start(harness: Harness, model_path: Path, aliases: tuple[str, ...] = ()) -> None:
    cfg = harness.config({MODEL: {"path": str(model_path), "ctx_len": 32768, "n_parallel": 1, "threads": 2,
                                  "swa_full": True, "prompt_cache_ram": 0, "aliases": list(aliases)}},
                         worker_command=None, queue_timeout_s=600.0, load_timeout_s=120.0)
    await harness.start(cfg)


async def _replay(harness: Harness, name: str, max_tokens: int = 4) -> dict[str, Any]:
    """Send a recorded request; its SSE events checked in Anthropic's order; the final
    message_delta."""
    path, headers, body = recorded(name)
    r = await harness.client.post(path, headers=headers, content=json.dumps({**body, "max_tokens": max_tokens}),
                                  timeout=900)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse(r.text)
    names = [e for e, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert "error" not in names
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["model"] == MODEL and start["id"].startswith("msg_")
    for (e, d), (e2, d2) in zip(events, events[1:]):
        if e == "content_block_start":
            assert e2 == "content_block_delta" and d2["index"] == d["index"]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    return delta


def _prompt(usage: dict[str, int]) -> int:
    return usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]


async def test_claude_code_sessions_reuse_the_prompt(harness: Harness, model_path: Path) -> None:
    """Two sessions' first requests and a tool turn: accepted as sent (mid-conversation
    system message, adaptive thinking on a model that does not think, effort,
    context_management, anthropic-beta), and the second session reuses the first's prefix
    although its attribution line differs."""
    await _start(harness, model_path)
    a = await _replay(harness, "session_a_first")
    ua = a["usage"]
    assert _prompt(ua) > 15_000  # all of Claude Code's prompt reached the model
    assert ua["cache_creation_input_tokens"] > 15_000 and ua["input_tokens"] == 0  # cache_control: kept
    assert a["context_management"] == {"applied_edits": []}  # clear_thinking keep "all": nothing to clear

    b = await _replay(harness, "session_b_first")
    ub = b["usage"]
    # everything before the user's own words: the tools, the system text, the date reminder
    assert ub["cache_read_input_tokens"] > 0.98 * _prompt(ub), ub
    assert ub["cache_creation_input_tokens"] == _prompt(ub) - ub["cache_read_input_tokens"]

    t = await _replay(harness, "session_b_tool_result")
    ut = t["usage"]
    assert ut["cache_read_input_tokens"] > 0.98 * _prompt(ut), ut


async def test_claude_model_names_thinking_on_a_model_that_does_not_think(harness: Harness,
                                                                        model_path: Path) -> None:
    """Claude's own model names (aliases here): Opus's adaptive thinking with effort and
    Sonnet 4.5's ``enabled`` with a 31,999-token budget, both with their recorded headers, on a
    model that does not think: answered without thinking, not a 400. (The bodies' fields
    around a short conversation: their 20k-token prompts are the test above's.)"""
    await _start(harness, model_path, aliases=("claude-opus-4-8", "claude-sonnet-4-5-20250929"))
    for name in ("default_model_first", "sonnet45_thinking_enabled"):
        path, headers, body = recorded(name)
        short = {**body, "stream": False, "stop_sequences": ["\n"], "tools": body["tools"][:1],
                 "system": body["system"][:2], "messages": [{"role": "user", "content": "Say hello."}]}
        r = await harness.client.post(path, headers=headers, content=json.dumps(short), timeout=300)
        assert r.status_code == 200, r.text
        m = r.json()
        assert m["type"] == "message" and m["model"] == MODEL, m  # the model the alias names
        assert all(b["type"] != "thinking" for b in m["content"])
        assert m["context_management"] == {"applied_edits": []}


def test_every_recorded_body_validates_unchanged() -> None:
    """The bodies exactly as Claude Code sent them pass the request checks."""
    for f in sorted(FIXTURES.glob("*.json")):
        body = json.loads(f.read_text())["body"]
        req = AnthropicMessagesRequest.model_validate(body)
        req.check()
        system = req.openai_messages()[0]
        assert system["role"] == "system" and "x-anthropic-billing-header" not in system["content"]
        assert req.asks_cache()
