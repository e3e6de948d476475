"""The Responses API's tool types, as function tools the local model can call.

What corral can hand to the model, it does; the client runs the call, as always:

- ``function``: as it is;
- ``namespace`` (a named group of function tools, e.g. Codex's ``multi_agent_v1``): each of
  its functions, by its own name; a call comes back as a ``function_call`` item with the
  ``namespace`` it came from;
- ``custom`` (free-form input, e.g. Codex's ``apply_patch``): a function with one string
  argument ``input`` (its grammar, if any, goes into the description); a call is a
  ``custom_tool_call`` item with that ``input``;
- ``local_shell``: a function ``local_shell`` taking ``command`` (argv), ``workdir`` and
  ``timeout_ms``; a call is a ``local_shell_call`` item with an ``exec`` action.

Tools OpenAI runs on its own servers (``web_search``, ``file_search``, ``code_interpreter``,
``image_generation``, ``computer_use_preview``, ``mcp``, ...) and types corral does not know
are left out, and the response says so in ``warnings`` (a corral field) instead of refusing the
request: Codex sends ``web_search`` whatever the provider. Their input items
(``web_search_call``, ...) are left out of the conversation the same way.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from corral import wire
from corral.errors import InvalidRequest

__all__ = ["Toolbox", "SHELL", "call_message"]

SHELL = "local_shell"
_SHELL_PARAMS = {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}, "description": "the program and its arguments"},
    "workdir": {"type": "string"}, "timeout_ms": {"type": "integer"}}, "required": ["command"]}


def _function(name: Any, description: Any, parameters: Any, strict: Any = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters, "strict": strict}}


class Toolbox:
    """One request's tools: their chat-shaped functions, the kind of each name, and the
    warnings about what was left out."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self.functions: list[dict[str, Any]] = []
        self.kinds: dict[str, str] = {}  # function name -> function | custom | local_shell
        self.namespaces: dict[str, str] = {}  # function name -> its namespace
        self.warnings: list[str] = []
        for i, t in enumerate(tools or []):
            self._add(t, f"tools.{i}")

    def _add(self, t: dict[str, Any], where: str, namespace: str | None = None) -> None:
        kind = t.get("type")
        name = t.get("name")
        if kind in ("function", "custom", "namespace") and (not isinstance(name, str) or not name):
            raise InvalidRequest(f"{where}.name: a {kind} tool needs a name", param=f"{where}.name")
        if kind == "function":
            self.functions.append(_function(name, t.get("description"), t.get("parameters"), t.get("strict")))
        elif kind == "custom":
            desc = t.get("description") or ""
            fmt = t.get("format")
            if isinstance(fmt, dict) and fmt.get("type") == "grammar":
                desc += f"\nThe input follows this {fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
            self.functions.append(_function(name, desc.strip(), {
                "type": "object", "properties": {"input": {"type": "string", "description": "the tool's input"}},
                "required": ["input"]}))
        elif kind == "namespace" and namespace is None:
            for j, inner in enumerate(t.get("tools") or []):
                self._add(inner, f"{where}.tools.{j}", namespace=name)
            return
        elif kind == SHELL:
            name = SHELL
            self.functions.append(_function(SHELL, "Run a command on the user's machine.", _SHELL_PARAMS))
        else:
            self.warnings.append(f"{where}: tools of type {kind!r} are not available here (a local model "
                                 "cannot run OpenAI's hosted tools); it was left out")
            return
        self.kinds[str(name)] = str(kind)
        if namespace is not None:
            self.namespaces[str(name)] = namespace

    def tool_choice(self, choice: Any) -> Any:
        """``tool_choice`` in OpenAI chat's shape."""
        if isinstance(choice, dict):
            kind, name = choice.get("type"), choice.get("name")
            if kind in ("function", "custom") and name in self.kinds:
                return {"type": "function", "function": {"name": name}}
            if kind == SHELL and SHELL in self.kinds:
                return {"type": "function", "function": {"name": SHELL}}
            self.warnings.append(f"tool_choice {kind!r}: not available here; the model chooses (auto)")
            return "auto"
        return choice

    def item(self, call: wire.ToolCall, status: str) -> dict[str, Any]:
        """A model's tool call as the output item of its tool's kind."""
        kind = self.kinds.get(call.name, "function")
        done = status == "completed"
        if kind == "custom":
            args = _arguments(call)
            value = args.get("input", "") if len(args) == 1 or "input" in args else call.arguments
            return {"id": "ctc_" + call.id, "type": "custom_tool_call", "status": status, "call_id": call.id,
                    "name": call.name, "input": (value if isinstance(value, str) else json.dumps(value)) if done else ""}
        if kind == SHELL:
            args = _arguments(call)
            cmd = args.get("command")
            action: dict[str, Any] = {"type": "exec", "command": cmd if isinstance(cmd, list) else [str(cmd or "")],
                      "workdir": args.get("workdir"), "timeout_ms": args.get("timeout_ms"), "env": {}}
            return {"id": "lsh_" + call.id, "type": "local_shell_call", "status": status, "call_id": call.id,
                    "action": action}
        item = {"id": "fc_" + call.id, "type": "function_call", "status": status, "call_id": call.id,
                "name": call.name, "arguments": call.arguments if done else ""}
        if call.name in self.namespaces:
            item["namespace"] = self.namespaces[call.name]
        return item


def _arguments(call: wire.ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        return {"input": call.arguments}
    return args if isinstance(args, dict) else {"input": call.arguments}


def call_message(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    """An earlier tool call (an input item) as an OpenAI chat tool call."""
    return {"id": call_id or "call_" + secrets.token_hex(8), "type": "function",
            "function": {"name": name, "arguments": arguments}}
