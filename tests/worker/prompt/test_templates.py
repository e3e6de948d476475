"""Unit tests of chat prompt rendering (no model)."""

from __future__ import annotations

import pytest

from corral import wire
from corral.worker.prompt.templates import JinjaTemplate, PlainTemplate, TemplateError, choose_template, render_chat

M = wire.ChatMessage

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GEMMA_LIKE = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}
    {% set first = messages[0]['content'] + '\n\n' %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set first = '' %}
    {% set loop_messages = messages %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<start_of_turn>{{ role }}
{{ (first if loop.first else '') + message['content'] | trim }}<end_of_turn>
{% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}
"""


def test_jinja_chatml() -> None:
    t = JinjaTemplate(CHATML)
    out = t.render([M("system", "Be brief."), M("user", "Hi")])
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_jinja_bos_trim_blocks_and_system_folding() -> None:
    t = JinjaTemplate(GEMMA_LIKE, bos_token="<bos>", eos_token="<eos>")
    out = t.render([M("system", "S."), M("user", "Hello "), M("assistant", "Hey"), M("user", "Bye")])
    assert out == (
        "<bos><start_of_turn>user\nS.\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHey<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_jinja_raise_exception_becomes_template_error() -> None:
    t = JinjaTemplate(GEMMA_LIKE, bos_token="<bos>")
    with pytest.raises(TemplateError, match="alternate"):
        t.render([M("user", "a"), M("user", "b")])


def test_jinja_is_sandboxed() -> None:
    t = JinjaTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateError):
        t.render([M("user", "x")])


def test_jinja_syntax_error() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        JinjaTemplate("{% for %}")


def test_plain_default() -> None:
    out = PlainTemplate().render([M("user", "Hi"), M("assistant", "Hello!"), M("user", "2+2?")])
    assert out == "User: Hi\nAssistant: Hello!\nUser: 2+2?\nAssistant:"


def test_plain_nitro_style_with_system_in_pre_prompt_position() -> None:
    t = PlainTemplate(pre_prompt="You are helpful.", user_prompt="USER: ", ai_prompt="ASSISTANT: ",
                      system_prompt="SYSTEM: ")
    assert t.render([M("user", "Hi")]) == "You are helpful.\nUSER: Hi\nASSISTANT:"
    assert t.render([M("system", "Be terse."), M("user", "Hi")]) == "SYSTEM: Be terse.\nUSER: Hi\nASSISTANT:"


def test_plain_turn_prefixes_are_stop_strings() -> None:
    assert PlainTemplate().stop_strings == ("\nUser:", "\nAssistant:")
    t = PlainTemplate(user_prompt="USER: ", ai_prompt="")
    assert t.stop_strings == ("\nUSER:",)
    assert JinjaTemplate("{{ messages[0]['content'] }}").stop_strings == ()


def test_plain_unknown_role() -> None:
    with pytest.raises(TemplateError, match="role"):
        PlainTemplate().render([M("wizard", "x")])


def test_choose_template_override_wins() -> None:
    s = wire.WorkerSettings(model_id="m", model_path="/x", chat_template=CHATML)
    assert isinstance(choose_template(s, "{{ 'model' }}", "", ""), JinjaTemplate)
    s2 = wire.WorkerSettings(model_id="m", model_path="/x")
    t = choose_template(s2, "{{ 'model template' }}", "", "")
    assert t.render([M("user", "x")]) == "model template"
    assert isinstance(choose_template(s2, None, "", ""), PlainTemplate)


MID_SYSTEM = [M("system", "S."), M("user", "Hi"), M("system", "Agents: a, b."), M("assistant", "Hey"),
              M("user", "Bye"), M("system", "Be terse.")]


def test_system_messages_stay_in_place_where_the_template_renders_them() -> None:
    t = JinjaTemplate(CHATML)
    assert t.system_in_place
    out = render_chat(t, MID_SYSTEM, None)
    assert out.index("user\nHi") < out.index("system\nAgents: a, b.") < out.index("assistant\nHey")
    assert out.index("user\nBye") < out.index("system\nBe terse.")


def test_system_messages_join_the_system_text_in_order_where_the_template_refuses_them() -> None:
    t = JinjaTemplate(GEMMA_LIKE, bos_token="<bos>")
    assert not t.system_in_place  # its role alternation refuses a system turn after the model's
    out = render_chat(t, MID_SYSTEM, None)
    assert out.startswith("<bos><start_of_turn>user\nS.\n\nAgents: a, b.\n\nBe terse.\n\nHi<end_of_turn>")
    plain = render_chat(PlainTemplate(), MID_SYSTEM, None)
    assert plain.startswith("S.\n\nAgents: a, b.\n\nBe terse.\nUser: Hi\nAssistant: Hey\nUser: Bye")
