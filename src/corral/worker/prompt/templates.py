"""Turning chat messages into one prompt string.

Two ways, chosen once per worker:

- ``JinjaTemplate``: a Hugging Face style chat template (the model's own
  ``tokenizer.chat_template`` from GGUF metadata, or ``WorkerSettings.chat_template``),
  rendered in a sandboxed Jinja2 environment the way ``transformers`` does: trim_blocks,
  lstrip_blocks, ``raise_exception``, ``bos_token``/``eos_token``, ``add_generation_prompt``.
- ``PlainTemplate``: for models without one (the embedded Gemma base model). Nitro style:

      <system text or pre_prompt>
      <user_prompt><content>
      <ai_prompt><content>
      ...
      <ai_prompt>

  A system message takes pre_prompt's place (system_prompt is put before its text);
  defaults: user_prompt "User: ", ai_prompt "Assistant: ".

A template that fails to render raises ``TemplateError`` with the reason, naming the
template; the engine reports that as ``RequestFailed(code="invalid_request")``. Rendering
is bounded in time, size and recursion (``template_bounds``); a template past the size of
its source, or one that crosses a bound while it is probed at load, is
``TemplateRefused``: the model does not load.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Protocol, Sequence

import jinja2

from corral import wire
from corral.worker.prompt.template_bounds import (
    DEFAULT_BOUNDS, BoundedSandbox, TemplateBoundExceeded, TemplateBounds, bounded, render_bounded)
from corral.worker.prompt.tool_prompt import generic_tool_messages, uses_tool_fields

__all__ = ["TemplateError", "TemplateRefused", "ChatTemplate", "JinjaTemplate", "PlainTemplate", "choose_template", "render_chat",
           "with_format"]

DEFAULT_USER_PROMPT = "User: "
DEFAULT_AI_PROMPT = "Assistant: "


class TemplateError(ValueError):
    pass


class TemplateRefused(TemplateError):
    """A template no request could use: too large, or past a bound on the load's probe."""


class ChatTemplate(Protocol):
    # Text that ends the assistant's turn, for templates whose turns end with no special
    # token: the engine adds them to a chat request's stop strings.
    stop_strings: tuple[str, ...]
    # Whether the template renders tools itself (the Jinja ``tools`` variable).
    supports_tools: bool

    # The template's text ("" for the plain prompt): where it takes variables such as
    # enable_thinking, the worker sets them (worker/reasoning/plan.py).
    source: str
    # Whether it renders a system message where it stands (after a user turn and after an
    # assistant turn); if not, later system messages join the first (``render_chat``).
    system_in_place: bool

    def render(self, messages: Sequence[wire.ChatMessage], tools: list[dict[str, Any]] | None = None,
               extra: dict[str, Any] | None = None) -> str: ...


def render_chat(template: ChatTemplate, messages: Sequence[wire.ChatMessage],
                tools: list[dict[str, Any]] | None, extra: dict[str, Any] | None = None) -> str:
    """Render a conversation; tools and tool turns go through the generic tool prompt
    when the template knows no tools (``tool_prompt``). ``extra``: more template variables
    (chat_template_kwargs; they never replace messages, tools or the special tokens).
    System messages after the first message join the system text, in order, unless the
    template renders them in place."""
    if (tools or uses_tool_fields(messages)) and not template.supports_tools:
        messages, tools = generic_tool_messages(messages, tools), None
    if not template.system_in_place:
        messages = merge_system(messages)
    return template.render(messages, tools, extra)


def merge_system(messages: Sequence[wire.ChatMessage]) -> Sequence[wire.ChatMessage]:
    """One system message first, holding every system message's text in order (blank
    lines between); the other messages as they were."""
    system = [m.content for m in messages if m.role == "system"]
    if len(system) < 2 and (not system or messages[0].role == "system"):
        return messages
    return [wire.ChatMessage("system", "\n\n".join(system)), *(m for m in messages if m.role != "system")]


def _renders_system_in_place(template: "JinjaTemplate") -> bool:
    """Probe: a system message after a user turn and after an assistant turn, rendered
    (no raise_exception) with its text."""
    def msg(role: str, text: str) -> wire.ChatMessage:
        return wire.ChatMessage(role, text)
    for probe in ([msg("system", "s0"), msg("user", "u1"), msg("system", "MIDSYS"), msg("assistant", "a1"),
                   msg("user", "u2")],
                  [msg("system", "s0"), msg("user", "u1"), msg("assistant", "a1"), msg("system", "MIDSYS"),
                   msg("user", "u2")]):
        try:
            if "MIDSYS" not in template.render(probe):
                return False
        except TemplateRefused:
            raise
        except TemplateError:
            return False
    return True


def _hf_message(m: wire.ChatMessage) -> dict[str, Any]:
    """A message as Hugging Face templates see it (tool call arguments as objects)."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            try:
                args: Any = json.loads(c.arguments)
            except ValueError:
                args = c.arguments
            calls.append({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
        d["tool_calls"] = calls
        if not m.content:
            d["content"] = None
    if m.tool_call_id is not None:
        d["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        d["name"] = m.name
    if m.reasoning:  # Qwen3 and DeepSeek templates read reasoning_content, gpt-oss's thinking
        d["reasoning_content"] = d["thinking"] = m.reasoning
    return d


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class JinjaTemplate:
    stop_strings: tuple[str, ...] = ()  # its turns end with the model's end-of-turn token

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 name: str = "the chat template", bounds: TemplateBounds = DEFAULT_BOUNDS) -> None:
        self.name = name
        self.bounds = bounds
        if len(source) > bounds.max_source:
            raise TemplateRefused(f"{name} has {len(source)} characters, more than the bound of "
                                  f"{bounds.max_source}")
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.add_filter("tojson", _tojson)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            with bounded(bounds, timed=False):  # Jinja folds constants while it compiles: sizes bounded
                self._tmpl = env.from_string(source)
        except TemplateBoundExceeded as exc:
            raise TemplateRefused(f"{name} was refused while it compiled: {exc}") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{name} does not compile: {exc}") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.supports_tools = "tools" in source
        self.source = source
        self._probing = True  # a bound crossed while probed at load refuses the template
        self.system_in_place = _renders_system_in_place(self)
        self._probing = False

    def render(self, messages: Sequence[wire.ChatMessage], tools: list[dict[str, Any]] | None = None,
               extra: dict[str, Any] | None = None) -> str:
        """The chat rendered, within ``bounds``; every failure is ``TemplateError`` naming the template."""
        # request variables never replace the template's functions (raise_exception, ...)
        variables: dict[str, Any] = {k: v for k, v in (extra or {}).items() if k not in self._tmpl.globals}
        if tools:
            variables["tools"] = tools
        context = {
            **variables,
            "messages": [_hf_message(m) for m in messages],
            "add_generation_prompt": True,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        try:
            with bounded(self.bounds):
                return render_bounded(self._tmpl.generate(context), self.bounds)
        except TemplateBoundExceeded as exc:
            if self._probing:
                raise TemplateRefused(f"{self.name} was refused at load: {exc}") from None
            raise TemplateError(f"{self.name} was stopped: {exc}") from None
        except TemplateError as exc:
            raise TemplateError(f"{self.name} raised: {exc}") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"{self.name} failed: {exc}") from None
        except MemoryError:
            raise TemplateError(f"{self.name} failed: it ran out of memory") from None
        except Exception as exc:  # noqa: BLE001 - RecursionError, OverflowError, TypeError...: the template's
            raise TemplateError(f"{self.name} failed: {type(exc).__name__}: {exc}") from None


def _tojson(value: object, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class PlainTemplate:
    supports_tools = False
    source = ""
    system_in_place = False  # all system text opens the prompt

    def __init__(
        self,
        *,
        pre_prompt: str | None = None,
        user_prompt: str | None = None,
        ai_prompt: str | None = None,
        system_prompt: str | None = None,
    ) -> None:
        self.pre_prompt = pre_prompt or ""
        self.user_prompt = DEFAULT_USER_PROMPT if user_prompt is None else user_prompt
        self.ai_prompt = DEFAULT_AI_PROMPT if ai_prompt is None else ai_prompt
        self.system_prompt = system_prompt or ""
        # A base model knows no end of turn: left alone it writes the next "User:" line
        # itself. A new line that starts a role's prefix ends the answer.
        self.stop_strings = tuple(
            "\n" + prefix.strip() for prefix in (self.user_prompt, self.ai_prompt) if prefix.strip()
        )

    def render(self, messages: Sequence[wire.ChatMessage], tools: list[dict[str, Any]] | None = None,
               extra: dict[str, Any] | None = None) -> str:
        system = [m.content for m in messages if m.role == "system"]
        lines: list[str] = []
        if system:
            lines.append(self.system_prompt + "\n".join(system))
        elif self.pre_prompt:
            lines.append(self.pre_prompt)
        for m in messages:
            if m.role == "system":
                continue
            if m.role == "assistant":
                lines.append(self.ai_prompt + m.content)
            elif m.role in ("user", "tool", "function"):
                lines.append(self.user_prompt + m.content)
            else:
                raise TemplateError(f"unknown message role {m.role!r}")
        lines.append(self.ai_prompt.rstrip(" ") if self.ai_prompt.endswith(" ") else self.ai_prompt)
        return "\n".join(lines)


def with_format(template: ChatTemplate, fmt: wire.PromptFormat | None) -> ChatTemplate:
    """The template a request renders with: a variant's plain prompt (``fmt``) where the
    model has no chat template, else the model's own."""
    if fmt is None or not isinstance(template, PlainTemplate):
        return template
    return PlainTemplate(pre_prompt=fmt.pre_prompt, user_prompt=fmt.user_prompt, ai_prompt=fmt.ai_prompt,
                         system_prompt=fmt.system_prompt)


def choose_template(
    s: wire.WorkerSettings, model_template: str | None, bos_token: str, eos_token: str
) -> ChatTemplate:
    source = s.chat_template or model_template
    if source:
        origin = "its chat_template setting" if s.chat_template else "its GGUF's tokenizer.chat_template"
        return JinjaTemplate(source, bos_token=bos_token, eos_token=eos_token,
                             name=f"the chat template of model {s.model_id} ({origin})",
                             bounds=TemplateBounds(time_s=s.chat_template_time_s))
    return PlainTemplate(
        pre_prompt=s.pre_prompt,
        user_prompt=s.user_prompt,
        ai_prompt=s.ai_prompt,
        system_prompt=s.system_prompt,
    )
