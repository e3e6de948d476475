"""Re-record the request bodies in this folder from the real clients (not part of the suite).

In a scratch venv with the clients (never the project's):

    python3 -m venv /tmp/clients-venv
    /tmp/clients-venv/bin/pip install openai-agents instructor anthropic openai "lm-eval[api]"
    corral serve --port 8080 &               # the embedded model, alias "default"
    /tmp/clients-venv/bin/python tests/e2e/recorded/record.py http://127.0.0.1:8080 openai_agents_chat

A recording proxy on 127.0.0.1:18778 forwards each request to corral and keeps its method,
path and JSON body; the client is driven as a user would drive it, pointed at the proxy;
the requests land in ``NAME.json`` beside this file (``client`` says what was run).
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

HERE = Path(__file__).parent
PROXY = "http://127.0.0.1:18778"


class Weather(BaseModel):
    city: str
    temperature_c: int


class User(BaseModel):
    name: str
    age: int


def _proxy(upstream: str, seen: list[dict[str, Any]]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self, method: str) -> None:
            size = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(size) if size else None
            req = urllib.request.Request(upstream + self.path, data=raw, method=method,
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    status, data, ctype = r.status, r.read(), r.headers.get("content-type")
            except urllib.error.HTTPError as e:
                status, data, ctype = e.code, e.read(), e.headers.get("content-type")
            item: dict[str, Any] = {"method": method, "path": self.path}
            if raw:
                item["body"] = json.loads(raw)
            seen.append(item)
            self.send_response(status)
            self.send_header("content-type", ctype or "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._forward("POST")

        def do_GET(self) -> None:  # noqa: N802
            self._forward("GET")

        def log_message(self, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 18778), Handler)


def _agent(chat: bool) -> str:
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_default_openai_client, set_tracing_disabled)
    from openai import AsyncOpenAI
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=PROXY + "/v1", api_key="x", max_retries=0)
    set_default_openai_client(client, use_for_tracing=False)

    @function_tool
    def get_temperature(city: str) -> int:
        """The temperature in a city, in degrees Celsius."""
        return 21

    model: Any = OpenAIChatCompletionsModel(model="default", openai_client=client) if chat else "default"
    agent = Agent(name="weather", instructions="Answer with the weather.", model=model, tools=[get_temperature],
                  output_type=Weather, model_settings=ModelSettings(tool_choice="required", temperature=0))
    kind = "model=OpenAIChatCompletionsModel" if chat else "the default model (OpenAIResponsesModel)"
    Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    return (f"openai-agents with openai: Agent(output_type=Weather, tools=[get_temperature], model_settings="
            f"ModelSettings(tool_choice='required', temperature=0)), {kind}; Runner.run_sync")


def _agent_named_output() -> str:
    from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=PROXY + "/v1", api_key="x", max_retries=0),
                              use_for_tracing=False)

    @function_tool
    def lookup_age(name: str) -> int:
        """A person's age, by name."""
        return 25

    agent = Agent(name="people", instructions="Extract the user.", model="default", tools=[lookup_age],
                  output_type=User, model_settings=ModelSettings(temperature=0))
    Runner.run_sync(agent, "Jason is 25 years old.", max_turns=2)
    return ("openai-agents with openai: Agent(output_type=User (a 'name' field), tools=[lookup_age], "
            "ModelSettings(temperature=0)), no tool_choice; Runner.run_sync")


def _instructor() -> str:
    import instructor
    from openai import OpenAI
    client = instructor.from_openai(OpenAI(base_url=PROXY + "/v1", api_key="x", max_retries=0),
                                    mode=instructor.Mode.RESPONSES_TOOLS)
    client.responses.create(model="default", input="Jason is 25 years old.", response_model=User, max_retries=0)
    return "instructor with openai: from_openai(mode=Mode.RESPONSES_TOOLS).responses.create(response_model=User)"


def _anthropic_parse() -> str:
    import anthropic
    client = anthropic.Anthropic(base_url=PROXY, api_key="x", max_retries=0)
    client.messages.parse(model="default", max_tokens=64, output_format=User,
                          messages=[{"role": "user", "content": "Jason is 25 years old. Extract the user."}])
    try:
        client.messages.create(model="default", max_tokens=8, container="c1",  # type: ignore[call-arg]
                               messages=[{"role": "user", "content": "hi"}])
    except anthropic.BadRequestError:
        pass
    return "anthropic: messages.parse(output_format=User), then messages.create(container='c1') (refused)"


def _anthropic_output_config() -> str:
    import anthropic
    client = anthropic.Anthropic(base_url=PROXY, api_key="x", max_retries=0)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    kw: dict[str, Any] = dict(model="default", max_tokens=64, extra_body={"temperature": 0},
                              output_config={"format": {"type": "json_schema", "schema": schema}},
                              messages=[{"role": "user", "content": "Jason is 25 years old. Extract the user."}])
    client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        s.get_final_text()
    return "anthropic: messages.create(output_config={'format': json_schema}), then messages.stream(...)"


def _openai_chat() -> str:
    from openai import OpenAI
    client = OpenAI(base_url=PROXY + "/v1", api_key="x", max_retries=0)
    kw: dict[str, Any] = dict(model="default", messages=[{"role": "user", "content": "..."}], max_tokens=32,
                              temperature=0)
    client.chat.completions.create(**kw)
    list(client.chat.completions.create(**kw, stream=True))
    return "openai: chat.completions.create(messages=[user '...'], max_tokens=32, temperature=0), then streamed"


def _lm_eval() -> str:
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    lm = LocalCompletionsAPI(base_url=PROXY + "/v1/completions", model="default", max_length=512)
    lm.loglikelihood([Instance("loglikelihood", {}, ("The capital of France is", " Paris"), 0),
                      Instance("loglikelihood", {}, ("The capital of France is", " a banana"), 1)])
    lm.generate_until([Instance("generate_until", {}, ("The capital of France is",
                                                       {"until": ["\n"], "max_gen_toks": 8}), 0)])
    lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("Paris is the capital of France.",), 0)])
    return ("lm-eval: LocalCompletionsAPI(base_url=.../v1/completions, model='default'; tokenizer_backend "
            "auto -> remote): loglikelihood, generate_until, loglikelihood_rolling")


PACKAGES = {"openai_agents_chat": ["openai-agents", "openai"], "openai_agents_named_output": ["openai-agents", "openai"], "openai_agents_responses": ["openai-agents", "openai"],
            "instructor_responses_tools": ["instructor", "openai"], "anthropic_parse": ["anthropic"],
            "anthropic_output_config": ["anthropic"], "openai_chat_base_model": ["openai"],
            "lm_eval_local_completions": ["lm-eval"]}

CLIENTS: dict[str, Callable[[], str]] = {
    "openai_agents_chat": lambda: _agent(True), "openai_agents_responses": lambda: _agent(False),
    "openai_agents_named_output": _agent_named_output,
    "instructor_responses_tools": _instructor, "anthropic_parse": _anthropic_parse,
    "anthropic_output_config": _anthropic_output_config, "openai_chat_base_model": _openai_chat,
    "lm_eval_local_completions": _lm_eval,
}


def main() -> None:
    upstream, name = sys.argv[1], sys.argv[2]
    seen: list[dict[str, Any]] = []
    server = _proxy(upstream, seen)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        note = CLIENTS[name]()
    finally:
        server.shutdown()
    from importlib.metadata import version
    note = ", ".join(f"{p} {version(p)}" for p in PACKAGES[name]) + ". " + note
    (HERE / f"{name}.json").write_text(json.dumps({"client": note, "requests": seen}, indent=1))


if __name__ == "__main__":
    main()
