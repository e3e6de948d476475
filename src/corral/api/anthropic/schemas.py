"""Anthropic Messages API request bodies and their translation to corral's wire request.

``system`` (a string or text blocks) becomes the system message, less a leading
``x-anthropic-billing-header:`` attribution line (Claude Code's, different in every session:
it means nothing to a local model and would end every prefix reuse there); ``role:
"system"`` messages anywhere in ``messages`` stay where they are (the worker's template
renders them in place or joins them to the system text: ``worker/templates.render_chat``);
each message's text blocks are joined; ``max_tokens`` is required (as Anthropic requires it);
``stop_sequences``, ``temperature`` (0-1), ``top_p``, ``top_k`` map onto sampling.
``tools`` / ``tool_choice`` (auto, any, tool, none) and ``tool_use`` / ``tool_result``
blocks become OpenAI tool calls and tool messages for the request core.
``output_config.format`` (``{"type": "json_schema", "schema": ...}``, what current SDKs
send for structured output; ``output_format`` is the older beta spelling) becomes OpenAI's
``response_format`` json_schema: the same schema check and grammar.
``thinking``: ``enabled`` thinks with ``budget_tokens``, ``adaptive`` as the model is set
(or at ``output_config.effort``'s level: low, medium, high are the model's
``reasoning_levels``; xhigh and max its own budget), ``disabled`` or absent not at all; a
preference (``thinking_optional``): a model that cannot think ignores it. ``thinking``
blocks of earlier assistant turns reach templates that render them, ``redacted_thinking``
blocks are dropped. ``context_management`` edits: ``context_edits``.

Top-level fields that only describe the request (``metadata``, ``service_tier``,
``inference_geo``, ``speed``, ``cache_control`` -- corral's prefix cache is automatic, and a
breakpoint anywhere only makes usage report cache creation --, ``diagnostics``,
``user_profile_id``, ``workspace_id``) are ignored, ``priority`` is the fair queue's (read by
corral.api.access); any other field is a 400 that names it, as are documents and the
server-side features (``container``, ``mcp_servers``): never an answer that silently leaves
out what was asked.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.api.core.images import data_url
from corral.api.core.schemas import CacheSalt
from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["AnthropicMessagesRequest", "AnthropicCountTokensRequest", "stop_reason"]

_LENIENT = ConfigDict(extra="ignore")


class Block(BaseModel):
    model_config = _LENIENT
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list["Block"] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking
    signature: str | None = None
    source: dict[str, Any] | None = None  # image: {type: base64, media_type, data} | {type: url, url}
    cache_control: dict[str, Any] | None = None  # a cache breakpoint (usage reports the creation)


class Message(BaseModel):
    model_config = _LENIENT
    role: Literal["user", "assistant", "system"]  # system: a mid-conversation system message
    content: str | list[Block]


class _Tool(BaseModel):
    model_config = _LENIENT
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None
    cache_control: dict[str, Any] | None = None


class _Thinking(BaseModel):
    model_config = _LENIENT
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = None


class _ToolChoice(BaseModel):
    model_config = _LENIENT
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


def _block_text(blocks: str | list[Block] | None, where: str) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    out = []
    for j, b in enumerate(blocks):
        if b.type != "text":
            raise UnsupportedOption(f"content blocks of type {b.type!r} are not supported here (text only)",
                                    param=f"{where}.{j}.type")
        out.append(b.text or "")
    return "".join(out)


def _image_url(b: Block, where: str) -> str:
    """An image block's source as an OpenAI image URL: base64 -> a data: URL; url as it is."""
    src = b.source or {}
    if src.get("type") == "base64" and isinstance(src.get("data"), str):
        return data_url(src["data"], str(src.get("media_type") or "image/*"))
    if src.get("type") == "url" and isinstance(src.get("url"), str) and src["url"]:
        return str(src["url"])
    raise InvalidRequest(f"{where}.source: an image source is {{type: base64, media_type, data}} or "
                         "{type: url, url}", param=f"{where}.source")


def _openai_messages(m: Message, i: int) -> list[dict[str, Any]]:
    """One Anthropic message -> OpenAI chat messages: text blocks joined, tool_use blocks
    -> the assistant's tool_calls, tool_result blocks -> tool messages (before the text)."""
    where = f"messages.{i}.content"
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "system":
        return [{"role": "system", "content": _block_text(m.content, where)}]
    texts, calls, results, thoughts = [], [], [], []
    parts: list[dict[str, Any]] = []  # text and images in order, where there are images
    for j, b in enumerate(m.content):
        if b.type == "text":
            texts.append(b.text or "")
            parts.append({"type": "text", "text": b.text or ""})
        elif b.type == "image" and m.role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b, f"{where}.{j}")},
                          "field": f"{where}.{j}"})
        elif b.type in ("thinking", "redacted_thinking") and m.role == "assistant":
            thoughts.append(b.thinking or "")
        elif b.type == "tool_use" and m.role == "assistant":
            if not b.id or not b.name:
                raise InvalidRequest(f"{where}.{j}: tool_use needs id and name", param=f"{where}.{j}")
            calls.append({"id": b.id, "type": "function",
                          "function": {"name": b.name, "arguments": json.dumps(b.input or {})}})
        elif b.type == "tool_result" and m.role == "user":
            if not b.tool_use_id:
                raise InvalidRequest(f"{where}.{j}.tool_use_id: required", param=f"{where}.{j}.tool_use_id")
            text = _block_text(b.content, f"{where}.{j}.content")
            results.append({"role": "tool", "tool_call_id": b.tool_use_id,
                            "content": f"Error: {text}" if b.is_error else text})
        else:
            raise UnsupportedOption(f"content blocks of type {b.type!r} are not supported in a {m.role} "
                                    "message (text, tool_use, tool_result)", param=f"{where}.{j}.type")
    out: list[dict[str, Any]] = list(results)
    images = len(parts) > len(texts)
    if texts or calls or images or not results:
        msg: dict[str, Any] = {"role": m.role, "content": parts if images else "".join(texts)}
        if any(thoughts):
            msg["reasoning_content"] = "".join(thoughts)
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


class _OutputFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class _OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: _OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


# output_config.effort -> the worker's reasoning level (``reasoning_levels``); xhigh and max:
# the model's own budget (None), unlimited unless its reasoning_budget says otherwise
_EFFORT_LEVELS = {"low": "low", "medium": "medium", "high": "high", "xhigh": None, "max": None}

# Claude Code opens its system prompt with an attribution line that changes with every
# session (``x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;``):
# it means nothing to a local model and, left in, no session would reuse another's prefix.
_ATTRIBUTION = "x-anthropic-billing-header:"


def _system_text(system: str | list[Block]) -> str:
    """The system prompt the model sees: its text, without a leading attribution line."""
    if isinstance(system, str):
        first, _, rest = system.partition("\n")
        return rest if first.startswith(_ATTRIBUTION) else system
    _block_text(system, "system")  # text blocks only
    texts = [b.text or "" for b in system]
    if texts and texts[0].startswith(_ATTRIBUTION) and "\n" not in texts[0].strip():
        texts = texts[1:]
    return "".join(texts)


class Threshold(BaseModel):
    """A context edit's trigger, keep or clear_at_least: ``{type, value}``."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_tokens", "tool_uses", "thinking_turns"]
    value: int = Field(ge=0)


class ContextEdit(BaseModel):
    """One of ``context_management.edits`` (corral.api.anthropic.context_edits applies them)."""
    model_config = ConfigDict(extra="forbid")
    type: Literal["clear_tool_uses_20250919", "clear_thinking_20251015", "compact_20260112"]
    trigger: Threshold | None = None
    keep: Threshold | Literal["all"] | None = None
    clear_at_least: Threshold | None = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = None
    instructions: str | None = None  # compact_20260112
    pause_after_compaction: bool | None = None


class ContextManagement(BaseModel):
    model_config = ConfigDict(extra="forbid")
    edits: list[ContextEdit] = []


# Top-level fields that only describe the request: accepted, no effect on the answer.
_DESCRIPTIVE = frozenset({"metadata", "service_tier", "inference_geo", "speed", "cache_control",
                          "diagnostics", "user_profile_id", "workspace_id",
                          "priority"})  # the fair queue's (vLLM's name), read and bounded by corral.api.access
# count_tokens also takes a whole Messages body: its generation fields change no count
_COUNT_ALSO_IGNORES = _DESCRIPTIVE | {"max_tokens", "stop_sequences", "temperature", "top_p", "top_k", "stream",
                                      "ignore_eos", "cache_salt"}


class AnthropicCountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # extras are refused by check(), by name
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    thinking: _Thinking | None = None
    output_config: _OutputConfig | None = None
    output_format: _OutputFormat | None = None  # the structured-outputs beta's spelling
    context_management: ContextManagement | None = None

    def reasoning(self) -> dict[str, Any]:
        """``thinking`` (and ``output_config.effort``) as the worker's fields: off unless
        enabled or adaptive; enabled thinks with its budget_tokens, adaptive as the model is
        set (its reasoning_budget) or at the effort's level; a model that cannot think
        ignores both (``thinking_optional``)."""
        t = self.thinking
        if t is None or t.type == "disabled":
            return {"think": False}
        effort = self.output_config.effort if self.output_config else None
        level = _EFFORT_LEVELS[effort] if effort else None
        if t.type == "enabled":
            return {"think": True, "thinking_budget": t.budget_tokens, "reasoning_effort": level,
                    "thinking_optional": True}
        return {"think": None, "reasoning_effort": level, "thinking_optional": True}  # adaptive

    def check(self) -> None:
        allowed = _DESCRIPTIVE if isinstance(self, AnthropicMessagesRequest) else _COUNT_ALSO_IGNORES
        for name in self.model_extra or {}:
            if name not in allowed:
                raise UnsupportedOption(f"{name}: this field is not supported by corral's Messages API",
                                        param=name)
        t = self.thinking
        if t is not None and t.type == "enabled" and t.budget_tokens is None:
            raise InvalidRequest("thinking.budget_tokens: required for type enabled", param="thinking.budget_tokens")
        if t is not None and t.budget_tokens is not None and t.budget_tokens < 0:
            raise InvalidRequest(f"thinking.budget_tokens: {t.budget_tokens} is below 0",
                                 param="thinking.budget_tokens")
        if self.output_format is not None and self.output_config is not None and self.output_config.format:
            raise InvalidRequest("output_format: give output_config.format or output_format, not both",
                                 param="output_format")
        if self.tool_choice is not None and self.tool_choice.type == "tool" and not self.tool_choice.name:
            raise InvalidRequest("tool_choice.name: required for type tool", param="tool_choice.name")

    def openai_messages(self) -> list[dict[str, Any]]:
        """The conversation in OpenAI's shape: the system text first (without the attribution
        line), then the messages (mid-conversation system messages where they stand)."""
        out = []
        system = _system_text(self.system) if self.system else ""
        if system:
            out.append({"role": "system", "content": system})
        for i, m in enumerate(self.messages):
            out.extend(_openai_messages(m, i))
        return out

    def asks_cache(self) -> bool:
        """Whether any block, tool or the request itself carries ``cache_control``."""
        if "cache_control" in (self.model_extra or {}):
            return True
        blocks = [*(self.system if isinstance(self.system, list) else []),
                  *(b for m in self.messages if isinstance(m.content, list) for b in m.content)]
        return (any(b.cache_control is not None for b in blocks)
                or any(t.cache_control is not None for t in self.tools or []))

    def openai_chat(self) -> dict[str, Any]:
        """tools, tool_choice, parallel_tool_calls and response_format in OpenAI's shape."""
        out = self._openai_tools()
        fmt = self.output_format or (self.output_config.format if self.output_config else None)
        if fmt is not None:
            out["response_format"] = {"type": "json_schema",
                                      "json_schema": {"name": "output", "schema": fmt.schema_}}
        return out

    def _openai_tools(self) -> dict[str, Any]:
        if not self.tools:
            return {}
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                   "parameters": t.input_schema}} for t in self.tools]
        tc = self.tool_choice
        choice: Any = None
        if tc is not None:
            choice = {"auto": "auto", "any": "required", "none": "none"}.get(tc.type) or {
                "type": "function", "function": {"name": tc.name}}
        parallel = None if tc is None or tc.disable_parallel_tool_use is None else not tc.disable_parallel_tool_use
        return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}


class AnthropicMessagesRequest(AnthropicCountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    ignore_eos: bool = False  # corral's extension (as on its OpenAI routes): generate every token
    cache_salt: CacheSalt | None = None  # corral's extension (vLLM's name): share the prompt cache only with it

    def check(self) -> None:
        super().check()
        t = self.thinking
        if t is not None and t.type == "enabled" and (t.budget_tokens or 0) >= self.max_tokens:
            raise InvalidRequest(f"max_tokens: must be greater than thinking.budget_tokens ({t.budget_tokens})",
                                 param="max_tokens")
        if any(not s for s in self.stop_sequences or []):
            raise InvalidRequest("stop_sequences: stop sequences must not be empty", param="stop_sequences")

    def sampling(self) -> wire.SamplingParams:
        """The wire's fields under their own names, and ``stop_sequences``."""
        return wire.sampling_from(vars(self), stop=None if self.stop_sequences is None else list(self.stop_sequences))


def stop_reason(finish_reason: str, stop_string: str | None,
                stop_sequences: list[str] | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) as Anthropic reports them."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if stop_string is not None and stop_string in (stop_sequences or []):
        return "stop_sequence", stop_string
    return "end_turn", None
