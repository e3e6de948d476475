"""OpenAI Responses API request bodies, their translation to corral's wire request, and
the bounded in-memory store behind ``previous_response_id``.

``input`` is a string or a list of items: messages (roles user, system, developer,
assistant; content a string or input_text / output_text / input_image parts), ``function_call`` and
``function_call_output``; ``instructions`` is the system message; ``max_output_tokens``,
``temperature``, ``top_p`` map onto sampling; ``tools`` (function), ``tool_choice`` and
``text.format`` (json_schema, json_object) go through the request core's tool calling
and structured output.
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
    image_url: str | None = None  # input_image: a data: or http(s) URL
    file_id: str | None = None  # input_image of an uploaded file (not supported: corral has no files API)


class _Item(BaseModel):
    model_config = _LENIENT
    type: str = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[_Part] | None = None
    summary: list[_Part] | None = None  # reasoning
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None
    arguments: str | None = None
    output: str | None = None


class _TextFormat(BaseModel):
    model_config = _LENIENT
    type: str = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class _TextConfig(BaseModel):
    model_config = _LENIENT
    format: _TextFormat | None = None


class _Reasoning(BaseModel):
    model_config = _LENIENT
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: str | None = None


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
    parallel_tool_calls: bool | None = None
    text: _TextConfig | None = None
    reasoning: _Reasoning | None = None
    metadata: dict[str, str] | None = None
    ignore_eos: bool = False  # corral's extension (as on its OpenAI routes): generate every token

    def wire_reasoning(self) -> dict[str, Any] | None:
        """``reasoning.effort`` as the worker's field (a level's budget is the model's
        ``reasoning_levels``; a model that cannot think refuses a level)."""
        effort = self.reasoning.effort if self.reasoning is not None else None
        return {"reasoning_effort": effort} if effort is not None else None

    def check(self) -> None:
        for i, t in enumerate(self.tools or []):
            if t.get("type") != "function":
                raise UnsupportedOption(f"tools of type {t.get('type')!r} are not supported (function only)",
                                        param=f"tools.{i}.type")

    def input_messages(self) -> list[dict[str, Any]]:
        """This request's own messages in OpenAI's chat shape (without instructions or
        earlier responses): message items, function_call items (the assistant's calls) and
        function_call_output items (tool results)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        out: list[dict[str, Any]] = []
        thought = ""  # a reasoning item's text, for the assistant turn after it
        for i, item in enumerate(self.input):
            if item.type == "reasoning":
                parts = item.content if isinstance(item.content, list) else (item.summary or [])
                thought += "".join(p.text or "" for p in parts)
            elif item.type == "message" and item.role is not None:
                msg = {"role": "system" if item.role == "developer" else item.role,
                       "content": _text(item.content, f"input.{i}.content")}
                if item.role == "assistant" and thought:
                    msg["reasoning_content"], thought = thought, ""
                out.append(msg)
            elif item.type == "function_call" and item.name and item.call_id:
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments or "{}"}}
                if out and out[-1]["role"] == "assistant" and not out[-1]["content"]:
                    out[-1].setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                if thought:
                    out[-1]["reasoning_content"], thought = thought, ""
            elif item.type == "function_call_output" and item.call_id:
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output or ""})
            else:
                raise UnsupportedOption(f"input items of type {item.type!r} are not supported "
                                        "(message, function_call, function_call_output, reasoning)",
                                        param=f"input.{i}.type")
        if not out:
            raise InvalidRequest("input: must not be empty", param="input")
        return out

    def openai_chat(self) -> dict[str, Any]:
        """tools, tool_choice, parallel_tool_calls, response_format in OpenAI chat's shape."""
        out: dict[str, Any] = {}
        if self.tools:
            out["tools"] = [{"type": "function", "function": {
                "name": t.get("name"), "description": t.get("description"), "parameters": t.get("parameters"),
                "strict": t.get("strict")}} for t in self.tools]
            tc = self.tool_choice
            if isinstance(tc, dict) and tc.get("type") == "function":
                tc = {"type": "function", "function": {"name": tc.get("name")}}
            out["tool_choice"] = tc
            out["parallel_tool_calls"] = self.parallel_tool_calls
        fmt = self.text.format if self.text else None
        if fmt is not None and fmt.type == "json_schema":
            out["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}}
        elif fmt is not None and fmt.type == "json_object":
            out["response_format"] = {"type": "json_object"}
        elif fmt is not None and fmt.type != "text":
            raise UnsupportedOption(f"text.format {fmt.type!r} is not supported", param="text.format.type")
        return out

    def sampling(self) -> wire.SamplingParams:
        kw: dict[str, Any] = {}
        if self.temperature is not None:
            kw["temperature"] = self.temperature
        if self.top_p is not None:
            kw["top_p"] = self.top_p
        return wire.SamplingParams(max_tokens=self.max_output_tokens, ignore_eos=self.ignore_eos, **kw)


def _text(content: str | list[_Part] | None, where: str) -> str | list[dict[str, Any]]:
    """A message item's content in OpenAI chat's shape: its text, or text and image parts
    (``input_image``) in their order."""
    if content is None or isinstance(content, str):
        return content or ""
    out: list[dict[str, Any]] = []
    for j, p in enumerate(content):
        if p.type == "input_image":
            if not p.image_url:
                raise UnsupportedOption("input_image: only image_url (a data: or http(s) URL) is supported, not "
                                        "file_id", param=f"{where}.{j}.image_url")
            out.append({"type": "image_url", "image_url": {"url": p.image_url}, "field": f"{where}.{j}"})
        elif p.type not in ("input_text", "output_text", "text") or p.text is None:
            raise UnsupportedOption(f"content parts of type {p.type!r} are not supported (text, input_image)",
                                    param=f"{where}.{j}.type")
        else:
            out.append({"type": "text", "text": p.text})
    if all(part["type"] == "text" for part in out):
        return "".join(part["text"] for part in out)
    return out


class ResponseStore:
    """Conversations of stored responses, by response id: bounded, in memory, LRU."""

    def __init__(self, max_items: int = 256, max_chars: int = 16 * 1024 * 1024) -> None:
        self.max_items = max_items
        self.max_chars = max_chars
        self._items: OrderedDict[str, tuple[str, list[dict[str, Any]]]] = OrderedDict()
        self._chars = 0

    @staticmethod
    def _size(msgs: list[dict[str, Any]]) -> int:
        return sum(len(str(m)) for m in msgs)

    def put(self, response_id: str, model: str, conversation: list[dict[str, Any]]) -> None:
        size = self._size(conversation)
        if size > self.max_chars:
            return
        self._items[response_id] = (model, conversation)
        self._chars += size
        while len(self._items) > self.max_items or self._chars > self.max_chars:
            _, (_, old) = self._items.popitem(last=False)
            self._chars -= self._size(old)

    def get(self, response_id: str) -> list[dict[str, Any]]:
        item = self._items.get(response_id)
        if item is None:
            raise InvalidRequest(
                f"previous_response_id: no stored response {response_id!r}; corral keeps the last "
                f"{self.max_items} responses created with store=true in memory (not across restarts)",
                param="previous_response_id")
        self._items.move_to_end(response_id)
        return list(item[1])
