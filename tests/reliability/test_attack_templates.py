"""Hostile chat templates (issue 45): bounded in time, size and recursion; every failure a
TemplateError naming the template (the worker answers it 400 invalid_request)."""

from __future__ import annotations

import pytest

from corral import wire
from corral.worker.prompt.templates import JinjaTemplate, TemplateError, TemplateRefused

FINE = "{% else %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}"


def _render(body: str) -> str:
    t = JinjaTemplate("{% if messages[-1].content == 'go' %}" + body + FINE, name="the chat template of model m",)
    return t.render([wire.ChatMessage("user", "go")])


@pytest.mark.parametrize("body", [
    "{% for x in range(100000) %}{% for y in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% set ns = namespace(s=[]) %}{% for i in range(99999) %}{% set ns.s = ns.s + ['x'*1000000] %}{% endfor %}",
    "{% set n = messages|length %}{{ ('{:>' ~ n*999999999 ~ '}').format(1) }}",
    "{{ 1/0 }}", "{{ 2.0 ** 10000 }}", "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
])
def test_a_hostile_template_is_a_template_error_naming_it(body: str) -> None:
    with pytest.raises(TemplateError, match="the chat template of model m"):
        _render(body)


def test_a_huge_template_is_refused_at_load() -> None:
    with pytest.raises(TemplateRefused, match="more than the bound"):
        JinjaTemplate("x" * (2 << 20))
