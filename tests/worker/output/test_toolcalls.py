"""Unit tests (no model): parsing tool calls out of streamed text, the generic tool
prompt, and tools in Jinja templates."""

from __future__ import annotations

import json

import pytest

from corral import wire
from corral.worker.prompt.templates import JinjaTemplate, PlainTemplate, render_chat
from corral.worker.prompt.tool_prompt import GENERIC_TOOL_INSTRUCTIONS
from corral.worker.output.toolcalls import ToolCallParser


def parse(text: str, step: int = 3, **kw: bool) -> tuple[str, list[tuple[str, dict]]]:
    p = ToolCallParser(**kw)
    out, calls = "", []
    for i in range(0, len(text), step):  # as it streams, a few characters at a time
        t, c = p.push(text[i:i + step])
        out += t
        calls += c
    t, c = p.finish()
    out += t
    calls += c
    assert all(c.id.startswith("call_") for c in calls)
    return out, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("text, content, calls", [
    ('Sure.<tool_call>\n{"name": "get", "arguments": {"a": 1}}\n</tool_call>',
     "Sure.", [("get", {"a": 1})]),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": "y"}}'
     '</tool_call>', "\n", [("a", {}), ("b", {"x": "y"})]),
    ('<tool_call>{"name": "a", "arguments": {"q": 2}}', "", [("a", {"q": 2})]),  # ended without the closing tag
    ('[TOOL_CALLS][{"name": "f", "arguments": {"q": 1}}, {"name": "g", "arguments": {}}]', "",
     [("f", {"q": 1}), ("g", {})]),
    ('[TOOL_CALLS]f[ARGS]{"q": 1}', "", [("f", {"q": 1})]),
    ('{"name": "f", "parameters": {"city": "Oslo"}}', "", [("f", {"city": "Oslo"})]),  # Llama 3.x
    ('<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", {})]),
    ('  {"name": "f", "arguments": "{\\"n\\": 3}"}', "", [("f", {"n": 3})]),  # arguments as a JSON string
    ('{"type": "function", "function": {"name": "f", "arguments": {}}}', "", [("f", {})]),
    ('{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {}}', "", [("a", {}), ("b", {})]),
])
def test_formats(text: str, content: str, calls: list) -> None:
    assert parse(text) == (content, calls)
    assert parse(text, step=1) == (content, calls)


@pytest.mark.parametrize("text", [
    '{"not": "a call"}', "[1, 2]", "hello <tool world", "no calls here", '{"name": "f", "arguments": 3}',
    "<tool_call>not json</tool_call>", "[TOOL_CALLS] nonsense", '{"name": "f", "arguments": {}} trailing',
])
def test_text_that_is_not_a_call_comes_back_unchanged(text: str) -> None:
    assert parse(text) == (text, [])


def test_text_streams_until_a_marker() -> None:
    p = ToolCallParser()
    assert p.push("Hello there") == ("Hello there", [])
    assert p.push(" <tool") == (" ", [])  # a possible marker start is held back
    text, calls = p.push('_call>{"name": "f", "arguments": {}}</tool_call>')
    assert text == "" and [c.name for c in calls] == ["f"]


def test_parallel_false_keeps_the_first_call() -> None:
    assert parse('{"name": "a", "arguments": {}}{"name": "b", "arguments": {}}', parallel=False) == \
        ("", [("a", {})])


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}
HISTORY = [
    wire.ChatMessage("system", "Be brief."),
    wire.ChatMessage("user", "Weather in Oslo?"),
    wire.ChatMessage("assistant", "", tool_calls=[wire.ToolCall("c1", "get_weather", '{"city": "Oslo"}')]),
    wire.ChatMessage("tool", "-4 C", tool_call_id="c1", name="get_weather"),
]

TOOL_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.tool_calls %}CALL {{ m.tool_calls[0].function.name }} {{ m.tool_calls[0].function.arguments | tojson }}"
    " id={{ m.tool_calls[0].id }}\n"
    "{% elif m.role == 'tool' %}RESULT {{ m.tool_call_id }} {{ m.content }}\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
)


def test_jinja_template_gets_tools_and_tool_turns_the_hugging_face_way() -> None:
    t = JinjaTemplate(TOOL_TEMPLATE)
    assert t.supports_tools
    text = render_chat(t, HISTORY, [WEATHER])
    assert text == ("TOOLS:get_weather;system: Be brief.\nuser: Weather in Oslo?\n"
                    'CALL get_weather {"city": "Oslo"} id=c1\nRESULT c1 -4 C\n')


@pytest.mark.parametrize("template", [PlainTemplate(), JinjaTemplate(
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}<assistant>")])
def test_templates_without_tools_get_the_generic_tool_prompt(template: object) -> None:
    text = render_chat(template, HISTORY, [WEATHER])  # type: ignore[arg-type]
    assert GENERIC_TOOL_INSTRUCTIONS in text
    assert json.dumps({"name": "get_weather", "description": "Weather in a city",
                       "parameters": WEATHER["function"]["parameters"]}) in text
    assert "Be brief." in text
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text  # the call in the history
    assert "Tool result (get_weather): -4 C" in text
    assert text.index("Be brief.") < text.index("Weather in Oslo?") < text.index("Tool result")


@pytest.mark.parametrize("text, streamed", [
    ("[1, 2, 3] are the numbers", "[1, 2, 3] are the numbers"),
    ("[see below] and more", "[see below] and more"),
    ('{"answer": 42, "why": "because"}', '{"answer": 42, "why": "because"}'),
    ('[{"city": "Oslo"}]', '[{"city": "Oslo"}]'),
])
def test_json_that_cannot_be_a_call_streams_at_once(text: str, streamed: str) -> None:
    """Only a call-shaped start is held to the end; the rest streams as it comes."""
    p = ToolCallParser()
    out = ""
    for i in range(0, len(text), 2):
        out += p.push(text[i:i + 2])[0]
    assert out == streamed[: len(out)] and len(out) >= len(streamed) - 2  # all but what a marker could start
    rest, calls = p.finish()
    assert out + rest == text and calls == []


@pytest.mark.parametrize("start", ['{"name": "f", "argu', '[{"name"', '{"arguments": {"a"', '{"type": "function"',
                                   '  {"na', "[", "{"])
def test_a_call_shaped_start_is_held(start: str) -> None:
    p = ToolCallParser()
    assert p.push(start) == ("", [])


def test_generic_tool_prompt_lists_the_tools_before_the_system_text() -> None:
    """A new system text (another session, a subagent) keeps the tools' prefix."""
    t = PlainTemplate()
    a = render_chat(t, HISTORY, [WEATHER])
    b = render_chat(t, [wire.ChatMessage("system", "Be thorough."), *HISTORY[1:]], [WEATHER])
    assert a.index(GENERIC_TOOL_INSTRUCTIONS) < a.index("Be brief.")
    common = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert common >= a.index(GENERIC_TOOL_INSTRUCTIONS) + len(GENERIC_TOOL_INSTRUCTIONS)
