"""Splitting generated text into thinking and answer, as it streams. Pure Python.

``push(text) -> (reasoning, answer)`` and ``finish() -> (reasoning, answer)``; text may be
cut anywhere (inside a tag, between any two characters): what could still be part of a
tag is held back until it is decided, and no tag ever reaches either part.

- ``TagSplitter``: a thinking block between an open and a close tag at the start of the
  output (or opened by the prompt). Whitespace right after the open tag, right before
  the close tag and right after it is dropped (llama-server's ``deepseek`` format does
  the same). Text that does not start with the open tag is all answer.
- ``HarmonySplitter``: gpt-oss messages. ``analysis`` content is reasoning, ``final``
  (and ``commentary`` with no recipient) the answer; a ``commentary to=functions.NAME``
  message becomes ``<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>`` in the
  answer, so the tool-call parser after it finds the call as for any model.
"""

from __future__ import annotations

import json

from corral.model.reasoning_format import ReasoningFormat

__all__ = ["TagSplitter", "HarmonySplitter", "Splitter", "partial_suffix"]


def partial_suffix(buf: str, markers: tuple[str, ...]) -> int:
    """How many trailing characters of ``buf`` could start one of ``markers``."""
    hold = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(buf)), hold, -1):
            if buf.endswith(m[:k]):
                hold = k
                break
    return hold


class TagSplitter:
    """States: start (nothing decided), reasoning, answer."""

    def __init__(self, fmt: ReasoningFormat, initial: str = "start") -> None:
        self.open, self.close = fmt.open, fmt.close
        self.state = initial
        self._held = ""
        self._lead = initial != "start"  # drop whitespace at the start of this part

    @property
    def in_reasoning(self) -> bool:
        return self.state == "reasoning"

    @property
    def answering(self) -> bool:
        return self.state == "answer"

    between = False  # (harmony only) after a thinking message, before the next header

    def push(self, text: str) -> tuple[str, str]:
        buf = self._held + text
        self._held = ""
        r: list[str] = []
        a: list[str] = []
        while buf:
            if self.state == "start":
                s = buf.lstrip()
                if s.startswith(self.open):
                    buf = s[len(self.open):]
                    self.state, self._lead = "reasoning", True
                    continue
                if not s or self.open.startswith(s):
                    self._held = buf
                    break
                self.state, self._lead = "answer", False
                continue
            if self._lead:
                buf = buf.lstrip()
                if not buf:
                    break
                self._lead = False
            if self.state == "answer":
                a.append(buf)
                break
            i = buf.find(self.close)
            if i >= 0:
                r.append(buf[:i].rstrip())
                buf = buf[i + len(self.close):]
                self.state, self._lead = "answer", True
                continue
            keep = partial_suffix(buf, (self.close,))
            body = buf[: len(buf) - keep]
            sent = body.rstrip()  # trailing whitespace waits: it may precede the close tag
            r.append(sent)
            self._held = buf[len(sent):]
            break
        return "".join(r), "".join(a)

    def finish(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        if self.state == "reasoning":  # held: whitespace and the start of a close tag, both dropped
            return "", ""
        if self.state == "start":
            self.state = "answer"
        return "", held


_H_CHANNEL, _H_MESSAGE = "<|channel|>", "<|message|>"
_H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_H_START = "<|start|>"
_H_MARKERS = (_H_CHANNEL, _H_MESSAGE, _H_START, "<|constrain|>", *_H_ENDS)


class HarmonySplitter:
    """States: start, header (reading a message header), content, between, plain (output
    that is not harmony at all: all answer)."""

    def __init__(self, fmt: ReasoningFormat, initial: str = "start") -> None:
        self.state = {"reasoning": "content", "answer": "content"}.get(initial, "start")
        self.kind = "reasoning" if initial == "reasoning" else "answer"  # of the content being read
        self.recipient = ""
        self._header = ""
        self._role = ""
        self._held = ""
        self._args: list[str] = []
        self._after_thinking = False

    @property
    def in_reasoning(self) -> bool:
        return self.state == "content" and self.kind == "reasoning"

    @property
    def answering(self) -> bool:
        return self.state == "plain" or (self.state == "content" and self.kind == "answer")

    @property
    def between(self) -> bool:
        return self.state in ("between", "header") and self._after_thinking

    def push(self, text: str) -> tuple[str, str]:
        buf = self._held + text
        self._held = ""
        r: list[str] = []
        a: list[str] = []
        while buf:
            if self.state == "plain":
                a.append(buf)
                break
            if self.state in ("start", "between"):
                i = buf.find(_H_CHANNEL)
                if self.state == "start" and i != 0:
                    s = buf.lstrip()
                    if not s:
                        self._held = buf
                        break
                    if s.startswith((_H_START, _H_CHANNEL)) or _H_CHANNEL.startswith(s) or _H_START.startswith(s):
                        self.state = "between"
                        continue
                    self.state = "plain"
                    continue
                if i < 0:  # a role header (<|start|>assistant to=...): kept for its recipient
                    keep = partial_suffix(buf, (_H_CHANNEL,))
                    self._role += buf[: len(buf) - keep]
                    self._held = buf[len(buf) - keep:]
                    break
                self._role += buf[:i]
                buf = buf[i + len(_H_CHANNEL):]
                self.state = "header"
                continue
            if self.state == "header":
                i = buf.find(_H_MESSAGE)
                if i < 0:
                    keep = partial_suffix(buf, (_H_MESSAGE,))
                    self._header += buf[: len(buf) - keep]
                    self._held = buf[len(buf) - keep:]
                    break
                self._open_message(self._role, self._header + buf[:i])
                self._header = self._role = ""
                buf = buf[i + len(_H_MESSAGE):]
                continue
            # content
            cut, end = -1, ""
            for m in (*_H_ENDS, _H_START):
                j = buf.find(m)
                if j >= 0 and (cut < 0 or j < cut):
                    cut, end = j, m
            body = buf if cut < 0 else buf[:cut]
            keep = partial_suffix(body, _H_MARKERS) if cut < 0 else 0
            self._route(body[: len(body) - keep], r, a)
            if cut < 0:
                self._held = body[len(body) - keep:]
                break
            a.append(self._close_message())
            buf = buf[cut + (0 if end == _H_START else len(end)):]
            self.state = "between"
        return "".join(r), "".join(a)

    def _open_message(self, role: str, header: str) -> None:
        words = header.replace("<|constrain|>", " ").split()
        channel = next((w for w in words if not w.startswith("to=")), "")
        to = next((w[3:] for w in (*role.split(), *words) if w.startswith("to=")), "")
        self.recipient = to
        if to.startswith("functions."):
            self.kind = "tool"
        elif channel == "analysis":
            self.kind = "reasoning"
        else:
            self.kind = "answer"
        self._after_thinking = False
        self.state = "content"

    def _route(self, text: str, r: list[str], a: list[str]) -> None:
        if not text:
            return
        if self.kind == "reasoning":
            r.append(text)
        elif self.kind == "tool":
            self._args.append(text)
        else:
            a.append(text)

    def _close_message(self) -> str:
        self._after_thinking = self.kind == "reasoning"
        if self.kind != "tool":
            return ""
        args = "".join(self._args).strip() or "{}"
        self._args = []
        name = self.recipient[len("functions."):]
        return '<tool_call>{"name": ' + json.dumps(name) + ', "arguments": ' + args + "}</tool_call>"

    def finish(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        r: list[str] = []
        a: list[str] = []
        if self.state == "content":  # held: the start of a marker, dropped
            a.append(self._close_message())
        elif self.state in ("plain", "start"):
            a.append(held)
        self.state = "between"
        return "".join(r), "".join(a)


Splitter = TagSplitter | HarmonySplitter
