"""OpenAI Responses API request bodies, their translation to corral's wire request, and
the bounded in-memory store behind ``previous_response_id``.

``input`` is a string or a list of message items (roles user, system, developer,
assistant; content a string or input_text / output_text parts); ``instructions`` is the
system message; ``max_output_tokens``, ``temperature``, ``top_p`` map onto sampling.
``store`` (default true, as OpenAI's) keeps the conversation of a finished response in
memory so a later request can continue it with ``previous_response_id``: at most
``ResponseStore.max_items`` responses and ``max_chars`` characters of conversation, the
oldest forgotten first, nothing on disk, nothing kept across a restart. An unknown or
forgotten id is a 400 that says so.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["ResponsesRequest", "ResponseStore"]

_LENIENT = ConfigDict(extra="ignore")


class _Part(BaseModel):
    model_config = _LENIENT
    type: str
    text: str | None = None


class _Item(BaseModel):
    model_config = _LENIENT
    type: str = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[_Part] | None = None


class _TextFormat(BaseModel):
    model_config = _LENIENT
    type: str = "text"


class _TextConfig(BaseModel):
    model_config = _LENIENT
    format: _TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = _LENIENT
    model: str = Field(min_length=1)
    input: str | list[_Item]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    text: _TextConfig | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    ignore_eos: bool = False  # corral's extension (as on its OpenAI routes): generate every token

    def check(self) -> None:
        if self.tools and self.tool_choice != "none":
            raise UnsupportedOption("tools are not supported yet", param="tools")
        fmt = self.text.format.type if self.text and self.text.format else "text"
        if fmt != "text":
            raise UnsupportedOption(f"text.format {fmt!r} is not supported yet (text only)",
                                    param="text.format")
        if self.reasoning and self.reasoning.get("effort") not in (None, "none"):
            raise UnsupportedOption("reasoning is not supported (no reasoning models)", param="reasoning")

    def input_messages(self) -> list[wire.ChatMessage]:
        """This request's own messages (without instructions or earlier responses)."""
        if isinstance(self.input, str):
            return [wire.ChatMessage("user", self.input)]
        out = []
        for i, item in enumerate(self.input):
            if item.type != "message" or item.role is None:
                raise UnsupportedOption(f"input items of type {item.type!r} are not supported yet",
                                        param=f"input.{i}.type")
            out.append(wire.ChatMessage("system" if item.role == "developer" else item.role,
                                        _text(item.content, f"input.{i}.content")))
        if not out:
            raise InvalidRequest("input: must not be empty", param="input")
        return out

    def sampling(self) -> wire.SamplingParams:
        kw: dict[str, Any] = {}
        if self.temperature is not None:
            kw["temperature"] = self.temperature
        if self.top_p is not None:
            kw["top_p"] = self.top_p
        return wire.SamplingParams(max_tokens=self.max_output_tokens, ignore_eos=self.ignore_eos, **kw)


def _text(content: str | list[_Part] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    out = []
    for j, p in enumerate(content):
        if p.type not in ("input_text", "output_text", "text") or p.text is None:
            raise UnsupportedOption(f"content parts of type {p.type!r} are not supported (text only)",
                                    param=f"{where}.{j}.type")
        out.append(p.text)
    return "".join(out)


class ResponseStore:
    """Conversations of stored responses, by response id: bounded, in memory, LRU."""

    def __init__(self, max_items: int = 256, max_chars: int = 16 * 1024 * 1024) -> None:
        self.max_items = max_items
        self.max_chars = max_chars
        self._items: OrderedDict[str, tuple[str, list[wire.ChatMessage]]] = OrderedDict()
        self._chars = 0

    @staticmethod
    def _size(msgs: list[wire.ChatMessage]) -> int:
        return sum(len(m.content) for m in msgs)

    def put(self, response_id: str, model: str, conversation: list[wire.ChatMessage]) -> None:
        size = self._size(conversation)
        if size > self.max_chars:
            return
        self._items[response_id] = (model, conversation)
        self._chars += size
        while len(self._items) > self.max_items or self._chars > self.max_chars:
            _, (_, old) = self._items.popitem(last=False)
            self._chars -= self._size(old)

    def get(self, response_id: str) -> list[wire.ChatMessage]:
        item = self._items.get(response_id)
        if item is None:
            raise InvalidRequest(
                f"previous_response_id: no stored response {response_id!r}; corral keeps the last "
                f"{self.max_items} responses created with store=true in memory (not across restarts)",
                param="previous_response_id")
        self._items.move_to_end(response_id)
        return list(item[1])
