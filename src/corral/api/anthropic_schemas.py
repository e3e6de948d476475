"""Anthropic Messages API request bodies and their translation to corral's wire request.

``system`` (a string or text blocks) becomes the system message; each message's text
blocks are joined; ``max_tokens`` is required (as Anthropic requires it);
``stop_sequences``, ``temperature`` (0-1), ``top_p``, ``top_k`` map onto sampling;
``metadata`` and ``service_tier`` are ignored. Images, documents and thinking are
refused with a 400 that names the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["AnthropicMessagesRequest", "AnthropicCountTokensRequest", "stop_reason"]

_LENIENT = ConfigDict(extra="ignore")


class _Block(BaseModel):
    model_config = _LENIENT
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list["_Block"] | None = None
    is_error: bool | None = None


class _Message(BaseModel):
    model_config = _LENIENT
    role: Literal["user", "assistant"]
    content: str | list[_Block]


class _Tool(BaseModel):
    model_config = _LENIENT
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None


class _ToolChoice(BaseModel):
    model_config = _LENIENT
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


def _text_of(blocks: str | list[_Block], where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    out = []
    for j, b in enumerate(blocks):
        if b.type == "text":
            out.append(b.text or "")
        elif b.type in ("tool_use", "tool_result"):
            raise UnsupportedOption(f"{b.type} blocks are not supported yet", param=f"{where}.{j}.type")
        else:
            raise UnsupportedOption(f"content blocks of type {b.type!r} are not supported (text only)",
                                    param=f"{where}.{j}.type")
    return "".join(out)


class AnthropicCountTokensRequest(BaseModel):
    model_config = _LENIENT
    model: str = Field(min_length=1)
    messages: list[_Message] = Field(min_length=1)
    system: str | list[_Block] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: dict[str, Any] | None = None

    def check(self) -> None:
        if self.thinking and self.thinking.get("type") != "disabled":
            raise UnsupportedOption("extended thinking is not supported", param="thinking")
        if self.tools and not (self.tool_choice and self.tool_choice.type == "none"):
            raise UnsupportedOption("tools are not supported yet", param="tools")

    def wire_messages(self) -> list[wire.ChatMessage]:
        out = []
        if self.system:
            out.append(wire.ChatMessage("system", _text_of(self.system, "system")))
        for i, m in enumerate(self.messages):
            out.append(wire.ChatMessage(m.role, _text_of(m.content, f"messages.{i}.content")))
        return out


class AnthropicMessagesRequest(AnthropicCountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    ignore_eos: bool = False  # corral's extension (as on its OpenAI routes): generate every token

    def check(self) -> None:
        super().check()
        if any(not s for s in self.stop_sequences or []):
            raise InvalidRequest("stop_sequences: stop sequences must not be empty", param="stop_sequences")

    def sampling(self) -> wire.SamplingParams:
        kw: dict[str, Any] = {}
        for name in ("temperature", "top_p", "top_k"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        return wire.SamplingParams(max_tokens=self.max_tokens, stop=list(self.stop_sequences or []),
                                   ignore_eos=self.ignore_eos, **kw)


def stop_reason(fin: wire.Finished | None, stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) as Anthropic reports them."""
    if fin is None:
        return "end_turn", None
    if fin.finish_reason == "length":
        return "max_tokens", None
    if fin.stop_string is not None and fin.stop_string in (stop_sequences or []):
        return "stop_sequence", fin.stop_string
    return "end_turn", None
