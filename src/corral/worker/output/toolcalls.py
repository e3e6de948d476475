"""Parsing tool calls out of generated text, as it streams. Pure Python, no model.

Formats recognized (whichever the model writes; no per-model configuration):

- Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any
  number, possibly after some text. Each call is emitted as soon as it closes.
- Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (and the newer
  ``[TOOL_CALLS]name[ARGS]{...}``).
- Llama 3.x: ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``).
- Plain JSON (the fallback, and what a forced call's grammar produces): an answer that
  is a JSON object (or a list of them) with ``name`` and ``arguments``/``parameters``;
  also OpenAI's own ``{"type": "function", "function": {...}}`` shape.

An answer that starts with ``{`` or ``[`` is held back while it can still be a call: its
first key must be one a call has (``name``, ``arguments``, ``parameters``, ``type``,
``function``, ``id``; a list must hold objects). ``[1, 2]``, ``[see below]`` or
``{"answer": ...}`` stream as text as soon as that is clear; a call-like answer is held to the
end (only then is it known to be a call) and released as text if it is not one after all.
Text that could be the start of a marker is held back like a stop string.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from corral import wire

__all__ = ["ToolCallParser", "calls_from_json"]

_HERMES_OPEN = "<tool_call>"
_HERMES_CLOSE = "</tool_call>"
_MISTRAL = "[TOOL_CALLS]"
_PYTHON_TAG = "<|python_tag|>"
_MARKERS = (_HERMES_OPEN, _MISTRAL, _PYTHON_TAG)
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]", re.S)


_CALL_KEYS = ("name", "arguments", "parameters", "type", "function", "id")


def _could_be_call(held: str) -> bool | None:
    """Whether a bare JSON answer's start can still be a tool call (None: too short to say)."""
    s = held.lstrip()
    if s.startswith("["):
        s = s[1:].lstrip()
        if not s:
            return None
        if s[0] != "{":
            return False
    s = s[1:].lstrip()
    if not s:
        return None
    if s[0] == "}":
        return None  # an empty object: decided at the end
    if s[0] != '"':
        return False
    end = s.find('"', 1)
    if end < 0:
        return None if any(k.startswith(s[1:]) for k in _CALL_KEYS) else False
    return s[1:end] in _CALL_KEYS


def _new_id() -> str:
    return "call_" + secrets.token_hex(12)


def _one_call(obj: Any) -> wire.ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if obj.get("type") == "function" and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            return None
        if not isinstance(parsed, dict):
            return None
        text = args
    elif isinstance(args, dict):
        text = json.dumps(args, ensure_ascii=False)
    else:
        return None
    return wire.ToolCall(_new_id(), name, text)


def calls_from_json(text: str) -> list[wire.ToolCall] | None:
    """Calls from text that is one or more JSON values (objects or lists of objects),
    separated by whitespace, ``,`` or ``;``. None unless ALL of it is calls."""
    dec = json.JSONDecoder()
    calls: list[wire.ToolCall] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,;":
            i += 1
        if i >= n:
            break
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        items = value if isinstance(value, list) else [value]
        for item in items:
            call = _one_call(item)
            if call is None:
                return None
            calls.append(call)
    return calls or None


class ToolCallParser:
    """``push(text)`` -> (text to send, calls complete now); ``finish()`` the same at the end."""

    def __init__(self, *, parallel: bool = True) -> None:
        self.parallel = parallel
        self.n_calls = 0
        self._held = ""  # undecided text (a possible marker start, or a JSON answer)
        self._mode = "start"  # start | text | hermes | rest (hold everything to the end)
        self._rest_marker = ""  # the marker that started "rest" mode ("" for a bare JSON answer)
        self._json_call = False  # a bare JSON answer whose start is a call's

    def _keep(self, calls: list[wire.ToolCall]) -> list[wire.ToolCall]:
        if not self.parallel:
            calls = calls[: max(0, 1 - self.n_calls)]
        self.n_calls += len(calls)
        return calls

    def push(self, text: str) -> tuple[str, list[wire.ToolCall]]:
        if not text:
            return "", []
        buf = self._held + text
        self._held = ""
        out: list[str] = []
        calls: list[wire.ToolCall] = []
        while buf:
            if self._mode == "start":
                stripped = buf.lstrip()
                if not stripped or (_MISTRAL.startswith(stripped) and stripped != _MISTRAL):
                    self._held = buf  # undecided yet
                    break
                if stripped[0] in "{[" and not stripped.startswith(_MISTRAL):
                    self._mode, self._rest_marker = "rest", ""  # a JSON answer: a call?
                    self._held = buf
                    break
                self._mode = "text"
            if self._mode == "text":
                cut, marker = self._find_marker(buf)
                if marker is None:
                    keep = self._partial_marker(buf)
                    out.append(buf[: len(buf) - keep])
                    self._held = buf[len(buf) - keep:]
                    break
                out.append(buf[:cut])
                buf = buf[cut + len(marker):]
                if marker == _HERMES_OPEN:
                    self._mode = "hermes"
                else:
                    self._mode, self._rest_marker = "rest", marker
                    self._held = buf
                    break
            if self._mode == "hermes":
                end = buf.find(_HERMES_CLOSE)
                if end < 0:
                    self._held = buf
                    break
                inner = buf[:end]
                buf = buf[end + len(_HERMES_CLOSE):]
                found = calls_from_json(inner)
                if found is None:
                    out.append(_HERMES_OPEN + inner + _HERMES_CLOSE)
                else:
                    calls.extend(self._keep(found))
                self._mode = "text"
            if self._mode == "rest":
                if not self._rest_marker and not self._json_call:
                    verdict = _could_be_call(buf)
                    if verdict is False:  # no call can start so: it is text
                        self._mode = "text"
                        continue
                    self._json_call = verdict is True
                self._held = buf
                break
        return "".join(out), calls

    def finish(self) -> tuple[str, list[wire.ToolCall]]:
        held, self._held = self._held, ""
        if self._mode == "hermes":
            found = calls_from_json(held)  # a model that ended without the closing tag
            return ("", self._keep(found)) if found is not None else (_HERMES_OPEN + held, [])
        if self._mode == "rest":
            body = held
            if self._rest_marker == _MISTRAL and _MISTRAL_NAMED.match(body):
                found = self._named_calls(body)
                if found is not None:
                    return "", self._keep(found)
            found = calls_from_json(body)
            if found is not None:
                return "", self._keep(found)
            return self._rest_marker + held, []
        return held, []

    def _named_calls(self, body: str) -> list[wire.ToolCall] | None:
        """``name[ARGS]{...}`` repeated (Mistral's newer format)."""
        dec = json.JSONDecoder()
        calls: list[wire.ToolCall] = []
        i = 0
        while i < len(body):
            m = _MISTRAL_NAMED.match(body, i)
            if m is None:
                return None if body[i:].strip(" \t\r\n") else calls
            try:
                args, i = dec.raw_decode(body, m.end())
            except ValueError:
                return None
            call = _one_call({"name": m.group(1), "arguments": args})
            if call is None:
                return None
            calls.append(call)
            if body.startswith(_MISTRAL, i):
                i += len(_MISTRAL)
        return calls or None

    @staticmethod
    def _find_marker(buf: str) -> tuple[int, str | None]:
        best, which = -1, None
        for m in _MARKERS:
            i = buf.find(m)
            if i >= 0 and (best < 0 or i < best):
                best, which = i, m
        return best, which

    @staticmethod
    def _partial_marker(buf: str) -> int:
        """How many trailing characters could start a marker."""
        hold = 0
        for m in _MARKERS:
            for k in range(min(len(m) - 1, len(buf)), hold, -1):
                if buf.endswith(m[:k]):
                    hold = k
                    break
        return hold
