"""The chat completions request body (OpenAI's shape plus llama.cpp's extensions) and its
translation into worker requests: messages with tool calls and tool results, tools and
tool_choice, response_format / grammar / json_schema, logprobs.

Other APIs (Ollama, Anthropic, Responses) build a ``ChatCompletionRequest`` from their own
body and go through the same ``generation`` core, so they get the same checks.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.api.core.images import ImageRef, data_url
from corral.api.core.schemas import SamplingFields
from corral.api.core.structured import JSON_OBJECT_SCHEMA, check_schema, forced_call_schema, schema_text
from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["ChatMessageIn", "ChatCompletionRequest", "ToolDef", "FunctionDef", "ToolCallIn",
           "ResponseFormat", "MAX_TOP_LOGPROBS"]

_LENIENT = ConfigDict(extra="ignore")
MAX_TOP_LOGPROBS = 20


class _ImageUrl(BaseModel):
    model_config = _LENIENT
    url: str = Field(min_length=1)
    detail: str | None = None


class _InputAudio(BaseModel):
    model_config = _LENIENT
    data: str = Field(min_length=1)  # base64
    format: str | None = None  # OpenAI: "wav" | "mp3"; corral reads more (api/core/audio.py)


class _ContentPart(BaseModel):
    """A content part: ``text``, ``image_url`` (a ``data:`` or http(s) URL; api/core/images.py)
    or ``input_audio`` (base64 and its format; api/core/audio.py)."""
    model_config = _LENIENT
    type: str
    text: str | None = None
    image_url: _ImageUrl | str | None = None
    input_audio: _InputAudio | None = None
    field: str | None = None  # set by a dialect's translation: the part's name in its own body (errors name it)

    def image(self) -> str | None:
        if self.type != "image_url" or self.image_url is None:
            return None
        return self.image_url if isinstance(self.image_url, str) else self.image_url.url

    def media(self, where: str) -> ImageRef | None:
        """The part's image or recording, if it is one."""
        if (url := self.image()) is not None:
            return ImageRef(url, self.field or where)
        if self.type == "input_audio":
            if self.input_audio is None:
                raise InvalidRequest(f"{self.field or where}.input_audio: required for a part of type input_audio",
                                     param=f"{self.field or where}.input_audio")
            return ImageRef(data_url(self.input_audio.data, "audio/*"), self.field or where, audio=True,
                            format=self.input_audio.format)
        return None


class FunctionCallIn(BaseModel):
    model_config = _LENIENT
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(BaseModel):
    model_config = _LENIENT
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(BaseModel):
    model_config = _LENIENT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None  # an assistant turn's thinking (llama-server's name)
    thinking: str | None = None  # the same, as Ollama and gpt-oss templates name it

    def text(self, index: int) -> str:
        """The turn's text, each image part a ``wire.MEDIA_MARKER`` where it is."""
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        out = []
        for j, part in enumerate(c):
            if part.media(f"messages.{index}.content.{j}") is not None:
                out.append(wire.MEDIA_MARKER)
                continue
            if part.type != "text" or part.text is None:
                raise UnsupportedOption(f"content parts of type {part.type!r} are not supported "
                                        "(text, image_url and input_audio)", param=f"messages.{index}.content.{j}.type")
            out.append(part.text)
        return "".join(out)

    def image_refs(self, index: int) -> list[ImageRef]:
        if not isinstance(self.content, list):
            return []
        return [ref for j, p in enumerate(self.content) if (ref := p.media(f"messages.{index}.content.{j}")) is not None]

    def to_wire(self, index: int) -> wire.ChatMessage:
        calls = None
        if self.tool_calls:
            if self.role != "assistant":
                raise InvalidRequest(f"messages.{index}.tool_calls: only assistant messages carry tool calls",
                                     param=f"messages.{index}.tool_calls")
            calls = []
            for j, c in enumerate(self.tool_calls):
                args = c.function.arguments
                calls.append(wire.ToolCall(c.id or f"call_{index}_{j}", c.function.name,
                                           args if isinstance(args, str) else json.dumps(args)))
        role = "system" if self.role == "developer" else self.role
        thought = (self.reasoning_content or self.thinking or None) if self.role == "assistant" else None
        return wire.ChatMessage(role, self.text(index), tool_calls=calls,
                                tool_call_id=self.tool_call_id if self.role == "tool" else None,
                                name=self.name if self.role == "tool" else None, reasoning=thought)


class FunctionDef(BaseModel):
    model_config = _LENIENT
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = _LENIENT
    type: Literal["function"]
    function: FunctionDef


class _NamedFunction(BaseModel):
    model_config = _LENIENT
    name: str


class NamedToolChoice(BaseModel):
    model_config = _LENIENT
    type: Literal["function"]
    function: _NamedFunction


class _JsonSchemaFormat(BaseModel):
    model_config = _LENIENT
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = _LENIENT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # llama.cpp's json_object + schema


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # llama.cpp: GBNF text
    json_schema: dict[str, Any] | None = None  # llama.cpp: a schema at the top level
    # reasoning models: OpenAI's effort level (a budget from the model's reasoning_levels;
    # "none": no thinking), llama-server's per-request budget and template variables
    reasoning_effort: str | None = Field(None, min_length=1, max_length=32)
    thinking_budget_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def check(self) -> None:
        self.check_common()
        if self.max_new_tokens() == 0:
            raise InvalidRequest("max_tokens: must be at least 1", param="max_tokens")
        if self.functions or self.function_call is not None:
            raise UnsupportedOption("functions/function_call (deprecated) are not supported; send tools",
                                    param="functions" if self.functions else "function_call")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs: requires logprobs: true", param="top_logprobs")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise InvalidRequest("tool_choice: requires tools", param="tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise InvalidRequest(f"tool_choice: no tool named {self.tool_choice.function.name!r} in tools",
                                     param="tool_choice.function.name")
        if self.tools:
            seen: set[str] = set()
            for i, t in enumerate(self.tools):
                if t.function.name in seen:
                    raise InvalidRequest(f"tools.{i}.function.name: {t.function.name!r} is given twice",
                                         param=f"tools.{i}.function.name")
                seen.add(t.function.name)
        # llama.cpp's raw constraints replace every other one; response_format governs a text
        # reply and a forced call's arguments follow the tool's schema, so those two combine
        # (OpenAI accepts it; the Agents SDK and instructor send it): see ``constraint``
        constraints = [k for k in ("grammar", "json_schema") if getattr(self, k) is not None]
        if constraints:
            if self.response_format is not None and self.response_format.type != "text":
                constraints.append("response_format")
            if self.forces_call():
                constraints.append("tool_choice")
        if len(constraints) > 1:
            raise InvalidRequest(f"{constraints[1]}: cannot be combined with {constraints[0]}",
                                 param=constraints[1])

    def forces_call(self) -> bool:
        return bool(self.tools) and (self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice))

    def uses_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def parses_tool_calls(self) -> bool:
        """Whether the answer may be a call: not when a response_format constrains it (no
        call forced), since then it is the format's JSON by construction, and an object of
        the format with a ``name`` must not come back as a call of that name."""
        if not self.uses_tools():
            return False
        rf = self.response_format
        return self.forces_call() or rf is None or rf.type == "text"

    def constraint(self) -> tuple[str | None, str | None]:
        """(GBNF grammar, JSON schema text) that constrain the output; at most one is set.
        A forced tool call is what gets generated, so its schema applies even with a
        response_format (which is still checked: it would govern a text reply)."""
        if self.forces_call():
            self._format_schema()
            return None, schema_text(self._forced_schema())
        if self.grammar is not None:
            if not self.grammar.strip():
                raise InvalidRequest("grammar: must not be empty", param="grammar")
            return self.grammar, None
        if self.json_schema is not None:
            check_schema(self.json_schema, "json_schema")
            return None, schema_text(self.json_schema)
        schema = self._format_schema()
        return None, None if schema is None else schema_text(schema)

    def _format_schema(self) -> dict[str, Any] | None:
        """response_format's schema, checked; None for text (or no format)."""
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            if rf.schema_ is not None:
                check_schema(rf.schema_, "response_format.schema")
                return rf.schema_
            return JSON_OBJECT_SCHEMA
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise InvalidRequest("response_format.json_schema.schema: required for type json_schema",
                                     param="response_format.json_schema.schema")
            check_schema(rf.json_schema.schema_, "response_format.json_schema.schema")
            return rf.json_schema.schema_
        return None

    def _forced_schema(self) -> dict[str, Any]:
        tools = self.tools or []
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
        funcs = []
        for i, t in enumerate(self.tools or []):
            if t in tools:
                if t.function.parameters is not None:
                    check_schema(t.function.parameters, f"tools.{i}.function.parameters")
                funcs.append((t.function.name, t.function.parameters))
        return forced_call_schema(funcs)

    def wire_messages(self) -> list[wire.ChatMessage]:
        return [m.to_wire(i) for i, m in enumerate(self.messages)]

    def image_refs(self) -> list[list[ImageRef]] | None:
        """Each message's images (None: the request has none)."""
        refs = [m.image_refs(i) for i, m in enumerate(self.messages)]
        return refs if any(refs) else None

    def wire_tools(self) -> list[dict[str, Any]] | None:
        if not self.uses_tools():
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools or []]

    def wire_reasoning(self) -> dict[str, Any]:
        """The request's thinking fields for the worker (it checks them against the model)."""
        if self.thinking_budget_tokens is not None and self.thinking_budget_tokens < 0:
            raise InvalidRequest(f"thinking_budget_tokens: {self.thinking_budget_tokens} is below 0",
                                 param="thinking_budget_tokens")
        return {"thinking_budget": self.thinking_budget_tokens, "reasoning_effort": self.reasoning_effort,
                "template_kwargs": self.chat_template_kwargs}

    def wire_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
