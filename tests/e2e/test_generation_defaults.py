"""A model's generation defaults (control/generation_defaults.py) through a real worker:
what reached its sampler for a request that sets nothing is the model's (a Qwen3-style
table: temperature 0.6, top_p 0.95, top_k 20, min_p 0), a request's own value wins, and
the listings show the defaults in force."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from support.harness import Harness

SPY = Path(__file__).parent.parent / "support" / "sampler_spy.py"
QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "seed": 7, "typical_p": 0.9,
         "dry_multiplier": 0.8, "stop": ["\n\n\n"], "default_max_tokens": 3}


def _seen(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_requests_sample_with_the_models_defaults_and_their_own_values_win(
        harness: Harness, model_path: Path) -> None:
    out = harness.tmp / "sampler.jsonl"
    cfg = harness.config({"q": {"path": str(model_path), "n_parallel": 1, **QWEN3}},
                         worker_command=[sys.executable, str(SPY), str(out)])
    await harness.start(cfg)
    c = harness.client
    assert c is not None
    r = await c.post("/v1/chat/completions", json={"model": "q", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 3  # default_max_tokens
    r = await c.post("/v1/chat/completions", json={"model": "q", "messages": [{"role": "user", "content": "Hi"}],
                                                   "temperature": 1.3, "top_k": 0, "stop": ["x"], "seed": 9,
                                                   "max_tokens": 2})
    assert r.status_code == 200, r.text
    r = await c.post("/api/generate", json={"model": "q", "prompt": "Hi", "stream": False,
                                            "options": {"temperature": 0.0}})
    assert r.status_code == 200, r.text
    nothing, own, ollama = _seen(out)
    assert {k: nothing[k] for k in QWEN3 if k != "default_max_tokens"} == {
        k: v for k, v in QWEN3.items() if k != "default_max_tokens"}
    assert nothing["max_tokens"] == 3 and nothing["resolved_seed"] == 7
    assert nothing["repeat_penalty"] == 1.0 and nothing["dry_base"] == 1.75  # not set: the built-in
    assert (own["temperature"], own["top_k"], own["stop"], own["seed"], own["max_tokens"]) == (1.3, 0, ["x"], 9, 2)
    assert (own["top_p"], own["min_p"]) == (0.95, 0.0)  # what it left out: the model's
    assert (ollama["temperature"], ollama["top_k"]) == (0.0, 20)

    props = (await c.get("/props", params={"model": "q"})).json()["default_generation_settings"]["params"]
    assert (props["temperature"], props["top_k"], props["min_p"], props["n_predict"], props["seed"]) == (
        0.6, 20, 0.0, 3, 7)
    listed = next(m for m in (await c.get("/models")).json()["data"] if m["id"] == "q")
    assert listed["generation"]["top_k"] == 20
    assert listed["generation"]["repeat_penalty"] == 1.0
    shown = (await c.post("/api/show", json={"model": "q"})).json()
    assert "temperature 0.6" in shown["parameters"].splitlines()
    assert "top_k 20" in shown["parameters"].splitlines() and 'stop "\\n\\n\\n"' in shown["parameters"]
    assert "num_predict 3" in shown["parameters"].splitlines()


async def test_a_system_default_and_template_kwargs_reach_the_template(harness: Harness, model_path: Path) -> None:
    """``system``: the system message of a chat that sends none (a request's own wins);
    ``chat_template_kwargs``: variables every render gets (a request's win key by key)."""
    tpl = ("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
           "{{ greeting | default('none') }}/{{ mood | default('none') }}")
    cfg = harness.config({"s": {"path": str(model_path), "n_parallel": 1, "chat_template": tpl,
                                "system": "Be brief.", "chat_template_kwargs": {"greeting": "hi", "mood": "calm"}}},
                         worker_command=None)
    await harness.start(cfg)
    c = harness.client
    assert c is not None
    r = await c.post("/apply-template", json={"model": "s", "messages": [{"role": "user", "content": "Q"}]})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"].startswith("[system:Be brief.][user:Q]")

    async def prompt_tokens(**body: Any) -> int:
        r = await c.post("/v1/chat/completions", json={"model": "s", "max_tokens": 1, **body})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens"])

    user = [{"role": "user", "content": "Q"}]
    plain = await prompt_tokens(messages=user)
    own_system = await prompt_tokens(messages=[{"role": "system", "content": "S"}, *user])
    longer_mood = await prompt_tokens(messages=user, chat_template_kwargs={"mood": "calm calm calm calm calm"})
    assert own_system < plain  # "[system:S]" replaced "[system:Be brief.]"
    assert longer_mood == plain + 4  # the request's mood replaced the model's; its greeting stayed
