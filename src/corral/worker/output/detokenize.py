"""Turning generated token pieces into streamable text.

Two small state machines, both pure Python and unit-tested without a model:

- ``Utf8Stream``: bytes in, whole characters out. A piece may end in the middle of a
  multi-byte character (byte-fallback tokens such as ``<0xE3>``); those bytes wait for
  the rest. Invalid bytes become U+FFFD, so the text is always valid UTF-8.
- ``StopMatcher``: text in, text that is safe to send out. Text that could still become
  a stop string is held back; once a stop string appears, only what came before it is
  released and the matcher reports the stop.
"""

from __future__ import annotations

import codecs

__all__ = ["Utf8Stream", "StopMatcher"]


class Utf8Stream:
    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._dec.decode(data, final=False)

    def flush(self) -> str:
        """Whatever is left (an incomplete sequence becomes U+FFFD)."""
        return self._dec.decode(b"", final=True)


class StopMatcher:
    """Holds back text that is a prefix of a stop string until it is decided.

    ``after_text``: stop strings that end the text only once something other than
    white space came before them (a template's turn markers, such as a base model's
    ``\nUser:``: a model that starts its answer with one would otherwise answer nothing)."""

    def __init__(self, stops: list[str], after_text: list[str] | None = None) -> None:
        self.stops = [s for s in stops if s]
        self.after_text = [s for s in after_text or [] if s and s not in self.stops]
        self._every = self.stops + self.after_text
        self._held = ""
        self._spoke = False  # text other than white space was released
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, text: str) -> str:
        """Feed new text; return the text that can be sent now. After a stop string is
        seen, ``stopped`` is True and further input is ignored."""
        if self.stopped:
            return ""
        if not self._every:
            return text
        buf = self._held + text
        cut = -1
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
                self.matched = s
        for s in self.after_text:
            i = buf.find(s)
            while i >= 0 and not self._spoke and not buf[:i].strip():
                i = buf.find(s, i + 1)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
                self.matched = s
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        hold = 0
        for s in self._every:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        out = buf[:-hold] if hold else buf
        self._held = buf[-hold:] if hold else ""
        if not self._spoke and out.strip():
            self._spoke = True
        return out

    def flush(self) -> str:
        """At the end of generation held text is no longer a possible stop: release it."""
        if self.stopped:
            return ""
        out, self._held = self._held, ""
        return out
