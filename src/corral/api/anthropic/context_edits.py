"""Anthropic's ``context_management`` edits, applied by the router before the conversation
is rendered (the API applies them server-side too; the client keeps its full history).

- ``clear_thinking_20251015``: thinking blocks of earlier assistant messages are dropped;
  ``keep`` is ``"all"`` (nothing cleared: what Claude Code sends, for its prefix) or
  ``{type: "thinking_turns", value: N}`` (the last N assistant messages with thinking keep
  it; the default is 1).
- ``clear_tool_uses_20250919``: once the request's input passes ``trigger``
  (``{type: "input_tokens", value}``, default 100,000, or ``{type: "tool_uses", value}``),
  the oldest tool results are replaced by a placeholder, all but the last ``keep``
  (``{type: "tool_uses", value}``, default 3) and those of ``exclude_tools``;
  ``clear_tool_inputs`` (true, or tool names) clears the calls' inputs too; with
  ``clear_at_least`` (input tokens) nothing is cleared unless at least that much would be.
- ``compact_20260112`` (server-side summarisation by the model) is accepted and not
  applied: the conversation goes to the model whole.

The response reports what was done as the API does: ``context_management.applied_edits``,
one entry per edit that cleared something (``cleared_tool_uses`` / ``cleared_thinking_turns``
and ``cleared_input_tokens``). The router has not tokenized the prompt yet, so input tokens
(trigger, clear_at_least, cleared_input_tokens) are an estimate: UTF-8 bytes / 4.
"""

from __future__ import annotations

import json
from typing import Any

from corral.api.anthropic.schemas import AnthropicCountTokensRequest, Block, ContextEdit, Message, Threshold

__all__ = ["CLEARED_TOOL_RESULT", "apply_context_edits"]

CLEARED_TOOL_RESULT = "[tool result cleared to save context]"
_DEFAULT_TRIGGER = 100_000
_DEFAULT_KEEP_TOOL_USES = 3


def _tokens(value: Any) -> int:
    """Estimated tokens of a piece of the request (UTF-8 bytes / 4)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return len(text.encode("utf-8", "surrogatepass")) // 4


def _request_tokens(body: AnthropicCountTokensRequest, messages: list[Message]) -> int:
    return (_tokens(body.model_dump(include={"system", "tools"}, exclude_none=True))
            + _tokens([m.model_dump(exclude_none=True) for m in messages]))


def apply_context_edits(body: AnthropicCountTokensRequest) -> list[dict[str, Any]] | None:
    """Apply the request's edits to ``body.messages`` in place; the applied edits as the
    response reports them (None: the request asked for no context management)."""
    if body.context_management is None:
        return None
    applied: list[dict[str, Any]] = []
    for edit in body.context_management.edits:
        if edit.type == "clear_thinking_20251015":
            done = _clear_thinking(body.messages, edit)
        elif edit.type == "clear_tool_uses_20250919":
            done = _clear_tool_uses(body, edit)
        else:
            done = None  # compact_20260112: not applied
        if done is not None:
            applied.append(done)
    return applied


def _clear_thinking(messages: list[Message], edit: ContextEdit) -> dict[str, Any] | None:
    if edit.keep == "all":
        return None
    keep = edit.keep.value if isinstance(edit.keep, Threshold) else 1
    with_thinking = [i for i, m in enumerate(messages) if m.role == "assistant" and isinstance(m.content, list)
                     and any(b.type in ("thinking", "redacted_thinking") for b in m.content)]
    cleared = with_thinking[:max(0, len(with_thinking) - keep)]
    tokens = 0
    for i in cleared:
        content = messages[i].content
        assert isinstance(content, list)
        tokens += sum(_tokens(b.thinking or "") for b in content if b.type in ("thinking", "redacted_thinking"))
        kept = [b for b in content if b.type not in ("thinking", "redacted_thinking")]
        messages[i] = messages[i].model_copy(update={"content": kept})
    if not cleared:
        return None
    return {"type": edit.type, "cleared_thinking_turns": len(cleared), "cleared_input_tokens": tokens}


def _clear_tool_uses(body: AnthropicCountTokensRequest, edit: ContextEdit) -> dict[str, Any] | None:
    messages = body.messages
    calls: dict[str, tuple[int, int, str]] = {}  # tool_use id -> (message, block, tool name)
    results: list[tuple[int, int]] = []  # tool_result blocks in order
    for i, m in enumerate(messages):
        for j, b in enumerate(m.content if isinstance(m.content, list) else []):
            if b.type == "tool_use" and b.id:
                calls[b.id] = (i, j, b.name or "")
            elif b.type == "tool_result":
                results.append((i, j))
    trigger = edit.trigger
    if trigger is not None and trigger.type == "tool_uses":
        if len(results) < trigger.value:
            return None
    elif _request_tokens(body, messages) < (trigger.value if trigger is not None else _DEFAULT_TRIGGER):
        return None
    keep = edit.keep.value if isinstance(edit.keep, Threshold) else _DEFAULT_KEEP_TOOL_USES
    return _clear_results(messages, edit, calls, results[:max(0, len(results) - keep)])


def _clear_results(messages: list[Message], edit: ContextEdit, calls: dict[str, tuple[int, int, str]],
                   candidates: list[tuple[int, int]]) -> dict[str, Any] | None:
    excluded = set(edit.exclude_tools or [])
    inputs = edit.clear_tool_inputs
    plan: list[tuple[int, int, tuple[int, int] | None]] = []  # (message, block, its call to clear)
    tokens = 0
    for i, j in candidates:
        content = messages[i].content
        assert isinstance(content, list)
        b = content[j]
        call = calls.get(b.tool_use_id or "")
        name = call[2] if call else ""
        if name in excluded:
            continue
        tokens += max(0, _tokens(b.content or "") - _tokens(CLEARED_TOOL_RESULT))
        clear_input = call is not None and (inputs is True or (isinstance(inputs, list) and name in inputs))
        if clear_input and call is not None:
            tokens += _tokens(_call_input(messages, call))
        plan.append((i, j, (call[0], call[1]) if clear_input and call is not None else None))
    least = edit.clear_at_least.value if edit.clear_at_least is not None else 0
    if not plan or tokens < least:
        return None
    for i, j, call_at in plan:
        _replace_block(messages, i, j, content=CLEARED_TOOL_RESULT)
        if call_at is not None:
            _replace_block(messages, *call_at, input={})
    return {"type": edit.type, "cleared_tool_uses": len(plan), "cleared_input_tokens": tokens}


def _call_input(messages: list[Message], at: tuple[int, int, str]) -> dict[str, Any]:
    content = messages[at[0]].content
    assert isinstance(content, list)
    return content[at[1]].input or {}


def _replace_block(messages: list[Message], i: int, j: int, **update: Any) -> None:
    content = messages[i].content
    assert isinstance(content, list)
    blocks: list[Block] = list(content)
    blocks[j] = blocks[j].model_copy(update=update)
    messages[i] = messages[i].model_copy(update={"content": blocks})
