"""Hostile chat templates (issue 45): bounded in time, size and recursion; every failure a
TemplateError naming the template (the worker answers it 400 invalid_request)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from corral import wire
from corral.worker.prompt.templates import JinjaTemplate, TemplateError, TemplateRefused
from reliability.server import real_models

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


# ------------------------------------------------------------------ through a real worker

HOSTILE = ("{% if messages[-1].content == 'loop' %}"
           "{% for x in range(100000) %}{% for y in range(100000) %}{% endfor %}{% endfor %}"
           "{% elif messages[-1].content == 'bomb' %}"
           "{% set ns = namespace(s=[]) %}{% for i in range(99999) %}{% set ns.s = ns.s + ['x'*1000000] %}{% endfor %}"
           "{% elif messages[-1].content == 'deep' %}"
           "{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}"
           "{% elif messages[-1].content == 'zero' %}{{ 1/0 }}"
           "{% else %}{% for m in messages %}{{ m.content }}{% endfor %}{% endif %}")


def _vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


@pytest.mark.integration
async def test_a_stalling_template_is_a_400_and_the_worker_serves_meanwhile(routers: Any, model_path: Path) -> None:
    r = routers(real_models(model_path, "t", ctx_len=512, n_parallel=2, chat_template=HOSTILE,
                            chat_template_time_s=3.0))
    async with r.aclient(timeout=120) as c:
        assert (await c.post("/models/load", json={"model": "t"})).status_code < 300
        stalled = asyncio.create_task(c.post("/v1/chat/completions", json={
            "model": "t", "messages": [{"role": "user", "content": "loop"}], "max_tokens": 4}))
        plain = await c.post("/v1/completions", json={"model": "t", "prompt": "The sea", "max_tokens": 4,
                                                      "temperature": 0})
        assert plain.status_code == 200 and not stalled.done()  # answered while the template spun
        bad = await stalled
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["type"] == "invalid_request_error" and "chat template" in bad.text
        pid = r.worker_pids()[0]
        before = _vm_kib(pid, "VmRSS")
        for content in ("bomb", "deep", "zero"):
            a = await c.post("/v1/chat/completions", json={
                "model": "t", "messages": [{"role": "user", "content": content}], "max_tokens": 4})
            assert a.status_code == 400 and "chat template" in a.text, (content, a.status_code, a.text[:300])
        assert _vm_kib(pid, "VmHWM") - before < 200 * 1024  # the bomb was stopped before it grew far
        fine = await c.post("/v1/chat/completions", json={
            "model": "t", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert fine.status_code == 200 and r.worker_pids() == [pid]  # the same worker, still serving
