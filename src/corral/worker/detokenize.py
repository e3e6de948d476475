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
    """Holds back text that is a prefix of a stop string until it is decided."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, text: str) -> str:
        """Feed new text; return the text that can be sent now. After a stop string is
        seen, ``stopped`` is True and further input is ignored."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        cut = -1
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (cut < 0 or i < cut):
                cut = i
                self.matched = s
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        if hold:
            self._held = buf[-hold:]
            return buf[:-hold]
        self._held = ""
        return buf

    def flush(self) -> str:
        """At the end of generation held text is no longer a possible stop: release it."""
        if self.stopped:
            return ""
        out, self._held = self._held, ""
        return out
