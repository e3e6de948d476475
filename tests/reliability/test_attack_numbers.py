"""Hostile numbers in every dialect (issue 45): negative, huge, float, NaN, infinite and
string values in each length, logprob, slot, seed, penalty, budget, bias and duration field
of OpenAI (chat, completions, responses, embeddings), Anthropic (messages), Ollama (generate,
chat, embed) and llama.cpp (/infill, /tokenize, /detokenize, /slots, /rerank; its /completion
fields are /v1/completions' here),
against a real router and worker.

Each answer: no 5xx; a 4xx in the dialect's error shape that names the field; or a 2xx (a
documented clamp, or a value in range). Afterwards ``/api/ps`` answers (an Ollama
``keep_alive`` of 1e308 once broke it for everyone), no slot is busy and the same worker
still serves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reliability.server import RouterProcess, real_models, serving, wait_until

pytestmark = pytest.mark.integration

NAN, INF = float("nan"), float("inf")
# 300_000: past the test model's vocabulary (262,144) as a token id, in range as a length
HOSTILE: list[Any] = [-1, -(2**63) - 1, 2**63, 10**30, 300_000, 1e308, -1e308, 1.5, NAN, INF, -INF, "12x"]

CHAT = [{"role": "user", "content": "Hi"}]
# route -> (the body every value goes into, its dialect's error shape, the fields)
ROUTES: dict[str, tuple[dict[str, Any], str, list[str]]] = {
    "/v1/chat/completions": ({"model": "m", "messages": CHAT, "max_tokens": 2}, "openai", [
        "max_tokens", "max_completion_tokens", "n", "top_logprobs", "seed", "temperature", "top_p", "top_k",
        "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "logit_bias.1", "t_max_predict_ms",
        "thinking_budget_tokens"]),
    "/v1/completions": ({"model": "m", "prompt": "Hi", "max_tokens": 2}, "openai", [
        "max_tokens", "n", "best_of", "logprobs", "seed", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
        "presence_penalty", "frequency_penalty", "logit_bias.1", "prompt.0", "t_max_predict_ms"]),
    "/v1/responses": ({"model": "m", "input": "Hi", "max_output_tokens": 2}, "openai", [
        "max_output_tokens", "temperature", "top_p", "top_logprobs"]),
    "/v1/embeddings": ({"model": "m", "input": "Hi"}, "openai", ["dimensions", "input.0"]),
    "/v1/messages": ({"model": "m", "messages": CHAT, "max_tokens": 2}, "anthropic", [
        "max_tokens", "temperature", "top_k", "top_p", "thinking.budget_tokens"]),
    "/api/generate": ({"model": "m", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}}, "ollama", [
        "options.num_predict", "options.num_ctx", "options.seed", "options.temperature", "options.top_k",
        "options.top_p", "options.min_p", "options.repeat_penalty", "options.repeat_last_n",
        "options.presence_penalty", "options.frequency_penalty", "keep_alive"]),
    "/api/chat": ({"model": "m", "messages": CHAT, "stream": False, "options": {"num_predict": 2}}, "ollama", [
        "options.num_predict", "options.num_ctx", "options.seed", "keep_alive"]),
    "/api/embed": ({"model": "m", "input": "Hi"}, "ollama", ["keep_alive", "options.num_ctx"]),
    "/infill": ({"model": "m", "input_prefix": "def f(", "input_suffix": ")", "n_predict": 2}, "openai", [
        "n_predict", "n_indent", "t_max_predict_ms", "seed"]),
    "/tokenize": ({"model": "m", "content": "Hi"}, "openai", []),
    "/detokenize": ({"model": "m", "tokens": [1]}, "openai", ["tokens.0"]),
    "/v1/rerank": ({"model": "e", "query": "q", "documents": ["a", "b"]}, "openai", ["top_n"]),
}


def _put(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    if path in ("prompt.0", "input.0"):  # a prompt / an input of token ids
        out[path.split(".")[0]] = [[value]]
    elif path == "tokens.0":
        out["tokens"] = [value]
    elif path == "thinking.budget_tokens":
        out["thinking"] = {"type": "enabled", "budget_tokens": value}
    elif "." in path:
        parent, leaf = path.split(".")
        out.setdefault(parent, {})[leaf] = value
    else:
        out[path] = value
    return out


def _shape_ok(shape: str, body: Any, field: str) -> bool:
    """The dialect's error shape, naming the field (its last part, or its parent's)."""
    names = {field.split(".")[-1], field.split(".")[0]}
    if shape == "ollama":
        text = body.get("error") if isinstance(body, dict) else None
        return isinstance(text, str) and any(n in text for n in names)
    if shape == "anthropic":
        if not (isinstance(body, dict) and body.get("type") == "error"):
            return False
        return any(n in body["error"]["message"] for n in names)
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return False
    return any(n in (err.get("param") or "") or n in err["message"] for n in names)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("numbers")
    models = real_models(model_path, "m", ctx_len=512, n_parallel=4)
    models.update(real_models(model_path, "e", ctx_len=512, n_parallel=2, embedding=True, pooling="rank"))
    r = RouterProcess(tmp, models, queue_timeout_s=30.0)
    yield from serving(r)


def _send(c: httpx.Client, route: str, body: Any) -> httpx.Response:
    return c.post(route, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def test_hostile_numbers_in_every_dialect(router: RouterProcess) -> None:
    bad: list[str] = []
    counts = {"2xx": 0, "4xx": 0}
    with router.client(timeout=120) as c:
        assert _send(c, "/v1/completions", ROUTES["/v1/completions"][0]).status_code == 200
        pids = sorted(router.worker_pids())
        for route, (base, shape, fields) in ROUTES.items():
            for field in fields:
                for value in HOSTILE:
                    r = _send(c, route, _put(base, field, value))
                    what = f"{route} {field}={value!r}: {r.status_code} {r.text[:200]}"
                    if r.status_code >= 500:
                        bad.append(what)
                    elif r.status_code == 400 and "does not support" in r.text:
                        counts["2xx"] += 1  # in range, for a capability the test model lacks (FIM tokens, thinking)
                    elif r.status_code >= 400:
                        counts["4xx"] += 1
                        if not _shape_ok(shape, r.json(), field):
                            bad.append("shape: " + what)
                    else:
                        counts["2xx"] += 1
                    if field == "keep_alive" and r.status_code < 300:
                        ps = c.get("/api/ps")
                        if ps.status_code != 200:
                            bad.append(f"/api/ps after {what}: {ps.status_code}")
        for value in HOSTILE:  # a slot id in the path
            r = c.post(f"/slots/{value}", params={"action": "erase", "model": "m"})
            if r.status_code >= 500 or (r.status_code >= 400 and not _shape_ok("openai", r.json(), "id_slot")):
                bad.append(f"/slots/{value}: {r.status_code} {r.text[:200]}")
        for value in HOSTILE:  # a token id as a logit_bias key
            body = {"model": "m", "prompt": "Hi", "max_tokens": 2, "logit_bias": {str(value): 1}}
            r = _send(c, "/v1/completions", body)
            if r.status_code >= 500 or (r.status_code >= 400 and not _shape_ok("openai", r.json(), "logit_bias")):
                bad.append(f"logit_bias key {value!r}: {r.status_code} {r.text[:200]}")
        print(f"\nhostile numbers: {counts}")
        assert bad == [], "\n".join(bad[:40])
        assert counts["4xx"] > 400
        assert c.get("/api/ps").status_code == 200

        def idle() -> bool:
            data = c.get("/models").json()["data"]
            return all(i["slots"]["busy"] == 0 for m in data for i in m["instances"] if i.get("slots"))

        wait_until(idle, 60, "every slot to be free again")
        assert _send(c, "/v1/completions", ROUTES["/v1/completions"][0]).status_code == 200
        assert sorted(router.worker_pids())[:len(pids)] == pids or set(pids) <= set(router.worker_pids())
    assert "Traceback" not in router.router_log()


@pytest.mark.parametrize("value", [1e308, NAN, INF, 10**30, "99999999999h", "1e400s", "Infinity", "-1e400s"])
def test_a_keep_alive_out_of_range_is_a_400_and_ps_answers(router: RouterProcess, value: Any) -> None:
    with router.client(timeout=120) as c:
        r = _send(c, "/api/generate", {"model": "m", "prompt": "Hi", "stream": False, "keep_alive": value,
                                       "options": {"num_predict": 1}})
        assert r.status_code == 400, r.text
        assert "keep_alive" in r.json()["error"]
        assert c.get("/api/ps").status_code == 200


@pytest.mark.parametrize(("value", "unloads"), [("5m", False), ("1h30m", False), (300, False), (-1, False),
                                                ("-5m", False), (3.5, False), ("292y", None)])
def test_keep_alive_in_every_form_it_takes(router: RouterProcess, value: Any, unloads: bool | None) -> None:
    with router.client(timeout=120) as c:
        r = _send(c, "/api/generate", {"model": "m", "prompt": "Hi", "stream": False, "keep_alive": value,
                                       "options": {"num_predict": 1}})
        if unloads is None:  # not a Go duration unit
            assert r.status_code == 400 and "keep_alive" in r.json()["error"]
            return
        assert r.status_code == 200, r.text
        ps = c.get("/api/ps")
        assert ps.status_code == 200
        (entry,) = [m for m in ps.json()["models"] if m["name"] == "m"]
        forever = isinstance(value, str) and value.startswith("-") or (not isinstance(value, str) and value < 0)
        assert entry["expires_at"].startswith("2318") is forever
