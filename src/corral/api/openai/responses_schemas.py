"""OpenAI Responses API request bodies and their translation to corral's wire request.

``input`` is a string or a list of items: messages (roles user, system, developer,
assistant; content a string or input_text / output_text / input_image parts), ``reasoning``,
``function_call`` and ``function_call_output`` (its output a string or parts),
``custom_tool_call`` / ``custom_tool_call_output`` and ``local_shell_call`` /
``local_shell_call_output``; items of OpenAI's hosted tools (``web_search_call``, ...) are
left out with a warning. ``instructions`` is the system message; ``max_output_tokens``,
``temperature``, ``top_p`` map onto sampling; ``tools`` (corral.api.openai.responses_tools),
``tool_choice`` and ``text.format`` (json_schema, json_object) go through the request core's
tool calling and structured output. ``include``, ``prompt_cache_key``, ``client_metadata``,
``service_tier`` and other fields corral has no use for are ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.api.core.schemas import CacheSalt
from corral.api.openai.responses_tools import SHELL, Toolbox, call_message
from corral.errors import InvalidRequest, UnsupportedOption

__all__ = ["ResponsesRequest"]

_LENIENT = ConfigDict(extra="ignore")
_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_RESULTS = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})


class _Part(BaseModel):
    model_config = _LENIENT
    type: str
    text: str | None = None
    image_url: str | None = None  # input_image: a data: or http(s) URL
    file_id: str | None = None  # input_image of an uploaded file (not supported: corral has no files API)
    input_audio: dict[str, Any] | None = None  # input_audio: {"data": base64, "format": "wav" | "mp3" | ...}


class _Item(BaseModel):
    model_config = _LENIENT
    type: str = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[_Part] | None = None
    summary: list[_Part] | None = None  # reasoning
    id: str | None = None
    call_id: str | None = None  # function_call, function_call_output, custom_tool_call, local_shell_call
    name: str | None = None
    arguments: str | None = None
    input: str | None = None  # custom_tool_call
    action: dict[str, Any] | None = None  # local_shell_call
    output: str | list[_Part] | None = None


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
    background: bool = False
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
    cache_salt: CacheSalt | None = None  # vLLM's: shares the prompt cache only with the same salt

    def wire_reasoning(self) -> dict[str, Any] | None:
        """``reasoning.effort`` as the worker's field (a level's budget is the model's
        ``reasoning_levels``; a model that cannot think refuses a level)."""
        effort = self.reasoning.effort if self.reasoning is not None else None
        return {"reasoning_effort": effort} if effort is not None else None

    def input_messages(self, warnings: list[str]) -> list[dict[str, Any]]:
        """This request's own messages in OpenAI's chat shape (without instructions or
        earlier responses): message items, the assistant's tool calls and their results.
        Items of hosted tools are left out, with a line in ``warnings``."""
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
            elif item.type in _CALLS:
                if item.type == "local_shell_call":
                    call = call_message(item.call_id or item.id, SHELL, json.dumps(item.action or {}))
                elif item.type == "custom_tool_call":
                    call = call_message(item.call_id, item.name or "", json.dumps({"input": item.input or ""}))
                else:
                    call = call_message(item.call_id, item.name or "", item.arguments or "{}")
                if not call["function"]["name"]:
                    raise InvalidRequest(f"input.{i}.name: a {item.type} item needs a name", param=f"input.{i}.name")
                if out and out[-1]["role"] == "assistant" and (not out[-1]["content"] or "tool_calls" in out[-1]):
                    out[-1].setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                if thought:
                    out[-1]["reasoning_content"], thought = thought, ""
            elif item.type in _RESULTS:
                output = item.output if isinstance(item.output, str) or item.output is None \
                    else _text(item.output, f"input.{i}.output")
                out.append({"role": "tool", "tool_call_id": item.call_id or item.id or "", "content": output or ""})
            elif item.type.endswith("_call") or item.type in ("compaction", "item_reference"):
                warnings.append(f"input.{i}: items of type {item.type!r} are not available here; left out")
            else:
                raise UnsupportedOption(f"input items of type {item.type!r} are not supported "
                                        "(message, reasoning, function_call, function_call_output, custom_tool_call, "
                                        "local_shell_call and their outputs)", param=f"input.{i}.type")
        if not out:
            raise InvalidRequest("input: must not be empty", param="input")
        return out

    def openai_chat(self, tools: Toolbox) -> dict[str, Any]:
        """tools, tool_choice, parallel_tool_calls, response_format in OpenAI chat's shape."""
        out: dict[str, Any] = {}
        if tools.functions:
            out["tools"] = tools.functions
            out["tool_choice"] = tools.tool_choice(self.tool_choice)
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
        """The wire's fields under their own names (``max_output_tokens`` for ``max_tokens``)."""
        return wire.sampling_from(vars(self), {"max_tokens": "max_output_tokens"})


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
        elif p.type == "input_audio":
            out.append({"type": "input_audio", "input_audio": p.input_audio, "field": f"{where}.{j}"})
        elif p.type not in ("input_text", "output_text", "text") or p.text is None:
            raise UnsupportedOption(f"content parts of type {p.type!r} are not supported (text, input_image, "
                                    "input_audio)",
                                    param=f"{where}.{j}.type")
        else:
            out.append({"type": "text", "text": p.text})
    if all(part["type"] == "text" for part in out):
        return "".join(part["text"] for part in out)
    return out
