"""Request bodies recorded from real clients (tests/e2e/recorded/, see record.py there),
replayed against corral: real workers, the real model (the embedded base Gemma).

What they pin (issue 26): a response format together with a forced tool call (the OpenAI
Agents SDK, instructor's RESPONSES_TOOLS) is answered with the call; Anthropic's
``output_config.format`` constrains the answer and unknown fields are refused; the
remote tokenizer of lm-evaluation-harness gets ``/tokenizer_info`` and ``/tokenize``
with vLLM's names; echo offsets index into the text returned; a base model's chat answer
is not cut to nothing by its own template's stop strings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from support.harness import Harness

pytestmark = pytest.mark.integration

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads((RECORDED / f"{name}.json").read_text())["requests"]
    return requests


async def _start(harness: Harness, model_path: Path) -> None:
    cfg = harness.config({"gemma-3-270m": {"path": str(model_path), "aliases": ["default"], "ctx_len": 1024,
                                           "n_parallel": 2, "threads": 1}}, worker_command=None)
    await harness.start(cfg)


async def _replay(harness: Harness, item: dict[str, Any], **override: Any) -> Any:
    body = {**item["body"], **override} if "body" in item else None
    if item["method"] == "GET":
        return await harness.client.get(item["path"])
    return await harness.client.post(item["path"], json=body, timeout=120)


def _sse(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def _valid_city_call(name: str, arguments: str) -> None:
    assert name == "get_temperature"
    args = json.loads(arguments)
    assert set(args) == {"city"} and isinstance(args["city"], str)


def _valid_weather(text: str) -> None:
    w = json.loads(text)
    assert set(w) == {"city", "temperature_c"}
    assert isinstance(w["city"], str) and isinstance(w["temperature_c"], int)


def _valid_user(data: Any) -> None:
    assert set(data) == {"name", "age"} and isinstance(data["name"], str) and isinstance(data["age"], int)


async def test_agents_sdk_forced_call_with_output_type(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    first, after_tool = recorded("openai_agents_chat")
    assert first["body"]["tool_choice"] == "required" and first["body"]["response_format"]["type"] == "json_schema"
    r = await _replay(harness, first)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    _valid_city_call(call["function"]["name"], call["function"]["arguments"])
    # streamed, the same request is the same call
    r = await _replay(harness, first, stream=True)
    assert r.status_code == 200, r.text
    deltas = [d for c in _sse(r.text) for ch in c["choices"] for d in ch["delta"].get("tool_calls") or []]
    assert len(deltas) == 1
    _valid_city_call(deltas[0]["function"]["name"], deltas[0]["function"]["arguments"])
    # the SDK's next turn: the tool's result in the history, no forced call: the format applies
    r = await _replay(harness, after_tool)
    assert r.status_code == 200, r.text
    _valid_weather(r.json()["choices"][0]["message"]["content"])

    first, after_tool = recorded("openai_agents_responses")
    assert first["body"]["tool_choice"] == "required" and first["body"]["text"]["format"]["type"] == "json_schema"
    r = await _replay(harness, first)
    assert r.status_code == 200, r.text
    (item,) = r.json()["output"]
    assert item["type"] == "function_call"
    _valid_city_call(item["name"], item["arguments"])
    r = await _replay(harness, after_tool)
    assert r.status_code == 200, r.text
    (message,) = r.json()["output"]
    assert message["type"] == "message"
    _valid_weather(message["content"][0]["text"])


async def test_instructor_responses_tools(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    (item,) = recorded("instructor_responses_tools")
    assert item["body"]["tool_choice"] == {"type": "function", "name": "User"} and item["body"]["text"]["format"]
    for stream in (False, True):
        r = await _replay(harness, item, stream=stream, temperature=0)  # the client sends none: greedy, to be sure
        assert r.status_code == 200, r.text
        if not stream:
            (out,) = r.json()["output"]
        else:
            done = [e for e in _sse(r.text) if e["type"] == "response.completed"]
            (out,) = done[0]["response"]["output"]
        assert out["type"] == "function_call" and out["name"] == "User"
        _valid_user(json.loads(out["arguments"]))


async def test_anthropic_structured_output(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    parse, container = recorded("anthropic_parse")
    assert "output_config" in parse["body"]
    r = await _replay(harness, parse, temperature=0)  # the client sends none: greedy, to be sure
    assert r.status_code == 200, r.text
    (block,) = r.json()["content"]
    _valid_user(json.loads(block["text"]))
    # a field corral cannot honour is refused, by name, in Anthropic's error shape
    r = await _replay(harness, container)
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "container" in r.json()["error"]["message"]

    create, stream = recorded("anthropic_output_config")
    r = await _replay(harness, create)
    assert r.status_code == 200, r.text
    _valid_user(json.loads(r.json()["content"][0]["text"]))
    assert r.json()["stop_reason"] == "end_turn"
    r = await _replay(harness, stream)
    assert r.status_code == 200, r.text
    text = "".join(e["delta"]["text"] for e in _sse(r.text) if e["type"] == "content_block_delta")
    _valid_user(json.loads(text))


async def test_lm_eval_remote_tokenizer_and_scoring(harness: Harness, model_path: Path) -> None:
    await _start(harness, model_path)
    session = recorded("lm_eval_local_completions")
    assert session[0]["path"] == "/tokenizer_info"
    # a GET loads nothing: the harness's first request finds the model loaded (load_on_startup)
    r = await harness.client.get("/tokenizer_info")
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_loaded", r.text
    assert (await harness.client.post("/models/load", json={"model": "gemma-3-270m"})).status_code < 300
    answers = []
    for item in session:
        r = await _replay(harness, item)
        assert r.status_code == 200, (item, r.text)
        answers.append((item, r.json()))
    info = answers[0][1]
    # what the harness reads: eos_token (its check), bos/pad tokens, the chat template
    assert info["eos_token"] == "<eos>" and info["bos_token"] == "<bos>" and info["pad_token"] == "<pad>"
    assert info["chat_template"] is None  # the base model: corral's plain turns
    assert info["add_bos_token"] is True and info["add_bos"] is True
    assert info["model_max_length"] == 512  # tokens per request: ctx_len 1024 over 2 slots
    ids = {}
    for item, answer in answers:
        if item["path"] == "/tokenize":
            assert "prompt" in item["body"] and item["body"]["add_special_tokens"] is False
            ids[item["body"]["prompt"]] = answer["tokens"]
    # the special tokens' ids, as the harness derives them (eos_token_id the same way, with
    # the request it sends for "<bos>"); no BOS added (add_special_tokens false)
    assert ids["<bos>"] == [2]
    r = await harness.client.post("/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False})
    assert r.json()["tokens"] == [1]
    assert ids["test"] and 2 not in ids["The capital of France is"]
    scored = [(item["body"], a) for item, a in answers
              if item["path"] == "/v1/completions" and item["body"].get("echo")]
    assert len(scored) == 3
    for body, answer in scored:
        (prompt,) = body["prompt"]
        lp = answer["choices"][0]["logprobs"]
        # lm-eval's parse_logprobs: token_logprobs[ctxlen:-1] are the continuation's
        assert len(lp["token_logprobs"]) == len(prompt) + 1 == len(lp["top_logprobs"]) == len(lp["text_offset"])
        assert lp["token_logprobs"][0] is None and all(x <= 0 for x in lp["token_logprobs"][1:])
        text = answer["choices"][0]["text"]
        # offsets index into the text returned
        for tok, off in zip(lp["tokens"], lp["text_offset"]):
            assert tok == "<bos>" or text[off:off + len(tok)] == tok
    # the rolling loglikelihood's prompt starts with the BOS id (prefix_token_id): no <bos> in
    # the text, and its offset takes no room
    rolling_body, rolling = scored[-1]
    assert rolling_body["prompt"][0][0] == 2
    choice = rolling["choices"][0]
    assert choice["logprobs"]["tokens"][0] == "<bos>" and not choice["text"].startswith("<bos>")
    assert choice["logprobs"]["text_offset"][:2] == [0, 0]
    r = await harness.client.get("/tokenizer_info", params={"model": "nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    # the harness decodes with /detokenize and reads vLLM's "prompt"
    r = await harness.client.post("/detokenize", json={"tokens": ids["The capital of France is"]})
    assert r.json()["prompt"] == r.json()["content"] == "The capital of France is"


async def test_base_model_chat_answer_is_not_cut_to_nothing(harness: Harness, model_path: Path) -> None:
    """The embedded base model answers "..." by writing "\\nAssistant:" first: with the
    template's stop strings active from the first token the answer was empty."""
    await _start(harness, model_path)
    plain, streamed = recorded("openai_chat_base_model")
    # the raw continuation of the rendered prompt starts with a template stop string
    raw = await harness.client.post("/v1/completions", json={"model": "default", "prompt": "User: ...\nAssistant:",
                                                             "max_tokens": 4, "temperature": 0})
    assert raw.json()["choices"][0]["text"].startswith("\nAssistant:")
    r = await _replay(harness, plain)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"].strip() and choice["finish_reason"] == "stop"
    assert r.json()["usage"]["completion_tokens"] < plain["body"]["max_tokens"]  # it did stop at a turn marker
    r = await _replay(harness, streamed)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in _sse(r.text) if c["choices"])
    assert text == choice["message"]["content"]


async def test_agents_sdk_output_type_with_a_name_field_is_not_a_call(harness: Harness, model_path: Path) -> None:
    """An Agent with tools and an output type that has a ``name`` field, no tool_choice:
    the format constrains the answer, which must come back as the output, not as a call
    of a tool named after the person (the SDK failed with "Tool Jason not found")."""
    await _start(harness, model_path)
    (item,) = recorded("openai_agents_named_output")
    assert "tool_choice" not in item["body"] and item["body"]["tools"]
    r = await _replay(harness, item)
    assert r.status_code == 200, r.text
    (out,) = r.json()["output"]
    assert out["type"] == "message"
    _valid_user(json.loads(out["content"][0]["text"]))
