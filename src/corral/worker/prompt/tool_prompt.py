"""The generic tool prompt: how tools reach a model whose chat template knows none.

A Jinja template that mentions ``tools`` gets them the Hugging Face way (the ``tools``
variable; assistant ``tool_calls`` and ``role: "tool"`` messages as they are). Any other
template (and the plain prompt of template-less base models) gets the conversation
rewritten into plain turns:

- a system message that lists the tools, one JSON object per line, and says how to call
  them (``GENERIC_TOOL_INSTRUCTIONS``), and after them the request's own system text: an
  agent whose system text changes (a new session, a subagent) still shares the tools'
  prefix with its last prompt;
- an assistant turn that called tools: its calls as JSON lines
  ``{"name": ..., "arguments": {...}}`` (after its text, if any);
- a tool result: a user turn ``Tool result (<name>): <content>``; consecutive user turns
  are joined (templates that insist on alternating roles stay happy).

The answer is parsed by ``toolcalls.ToolCallParser``, which reads that JSON form.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from corral import wire

__all__ = ["GENERIC_TOOL_INSTRUCTIONS", "generic_tool_messages", "uses_tool_fields"]

GENERIC_TOOL_INSTRUCTIONS = (
    "To call a tool, reply with only a JSON object of this form and nothing else:\n"
    '{"name": "<tool name>", "arguments": {<the arguments>}}\n'
    "To call several tools, write one such object per line. Otherwise, answer normally."
)


def uses_tool_fields(messages: Sequence[wire.ChatMessage]) -> bool:
    return any(m.tool_calls or m.role == "tool" for m in messages)


def _tool_line(tool: dict[str, Any]) -> str:
    fn = tool.get("function", tool)
    entry = {"name": fn.get("name")}
    if fn.get("description"):
        entry["description"] = fn["description"]
    entry["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
    return json.dumps(entry, ensure_ascii=False)


def _call_line(call: wire.ToolCall) -> str:
    try:
        args: Any = json.loads(call.arguments)
    except ValueError:
        args = call.arguments
    return json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)


def generic_tool_messages(messages: Sequence[wire.ChatMessage],
                          tools: list[dict[str, Any]] | None) -> list[wire.ChatMessage]:
    out: list[wire.ChatMessage] = []
    if tools:
        listing = "\n".join(_tool_line(t) for t in tools)
        out.append(wire.ChatMessage("system", f"You can use these tools:\n{listing}\n{GENERIC_TOOL_INSTRUCTIONS}"))
    for m in messages:
        if m.role == "system" and out and out[0].role == "system" and len(out) == 1:
            out[0] = wire.ChatMessage("system", out[0].content + "\n\n" + m.content)
            continue
        if m.role == "tool":
            label = f" ({m.name})" if m.name else ""
            msg = wire.ChatMessage("user", f"Tool result{label}: {m.content}")
        elif m.tool_calls:
            lines = [m.content] if m.content else []
            lines += [_call_line(c) for c in m.tool_calls]
            msg = wire.ChatMessage("assistant", "\n".join(lines))
        else:
            msg = wire.ChatMessage(m.role, m.content)
        if out and msg.role == "user" and out[-1].role == "user":
            out[-1] = wire.ChatMessage("user", out[-1].content + "\n" + msg.content)
        else:
            out.append(msg)
    return out
