"""`corral run MODEL [PROMPT]`: one answer, or an interactive chat in a terminal.

With PROMPT or piped stdin: streams one answer to stdout and exits. In a terminal: a chat
that keeps the history and streams each answer; Ctrl-C stops the answer being written
(closing the request frees the server's slot), not the program; /bye or Ctrl-D leaves;
``/set system TEXT`` sets the system prompt, ``/clear`` forgets the conversation.
Routes used: POST /models/load, POST /v1/chat/completions (stream).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import typer

from corral.cli.client import Api, ApiError, HostOpt, PortOpt, ServerOpt, err, fail, server_url

__all__ = ["register", "Chat"]

HELP = """commands:
  /set system TEXT   set the system prompt (/set system with no text clears it)
  /set parameter temperature|max_tokens VALUE
  /clear             forget the conversation
  /bye               leave (or Ctrl-D)
  Ctrl-C             stop the answer being written"""


@dataclass
class Answer:
    text: str = ""
    tokens: int = 0
    stopped: bool = False
    ttft_s: float | None = None
    seconds: float = 0.0
    finish: str | None = None


@dataclass
class Chat:
    api: Api
    model: str
    system: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)

    def messages(self, prompt: str) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history + [{"role": "user", "content": prompt}]

    def ask(self, prompt: str) -> Answer:
        """Streams one answer to stdout; Ctrl-C stops it (the partial answer is kept)."""
        body = {"model": self.model, "messages": self.messages(prompt), "stream": True,
                "stream_options": {"include_usage": True}, **self.options}
        ans = Answer()
        t0 = time.perf_counter()
        try:
            with self.api.stream("POST", "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise RuntimeError(chunk["error"].get("message", "the server reported an error"))
                    if chunk.get("usage"):
                        ans.tokens = chunk["usage"].get("completion_tokens", ans.tokens)
                    choices = chunk.get("choices") or []
                    if not choices:
                        continue
                    if choices[0].get("finish_reason"):
                        ans.finish = choices[0]["finish_reason"]
                    piece = (choices[0].get("delta") or {}).get("content")
                    if piece:
                        if ans.ttft_s is None:
                            ans.ttft_s = time.perf_counter() - t0
                        ans.text += piece
                        sys.stdout.write(piece)
                        sys.stdout.flush()
        except KeyboardInterrupt:
            ans.stopped = True  # leaving the with-block closed the request: the server aborts it
        ans.seconds = time.perf_counter() - t0
        self.history += [{"role": "user", "content": prompt}]
        if ans.text:
            self.history.append({"role": "assistant", "content": ans.text})
        return ans

    def command(self, line: str) -> bool:
        """Handles a /command; False when the chat should end."""
        word, _, rest = line.partition(" ")
        if word in ("/bye", "/exit", "/quit"):
            return False
        if word == "/clear":
            self.history.clear()
            print("cleared the conversation")
        elif word == "/set" and rest.split(" ", 1)[0] == "system":
            text = rest.partition(" ")[2].strip()
            self.system = text or None
            print("set the system prompt" if text else "cleared the system prompt")
        elif word == "/set" and rest.split(" ", 1)[0] == "parameter":
            self._set_parameter(rest.split()[1:])
        elif word in ("/?", "/help"):
            print(HELP)
        else:
            print(f"unknown command {word!r}; /? lists the commands")
        return True


    def _set_parameter(self, args: list[str]) -> None:
        kinds: dict[str, type] = {"temperature": float, "max_tokens": int}
        if len(args) != 2 or args[0] not in kinds:
            print("usage: /set parameter temperature|max_tokens VALUE")
            return
        try:
            self.options[args[0]] = kinds[args[0]](args[1])
        except ValueError:
            print(f"{args[0]}: not a number: {args[1]!r}")
            return
        print(f"set {args[0]} to {args[1]}")


def _stats(ans: Answer) -> str:
    parts = []
    if ans.stopped:
        parts.append("stopped")
    if ans.ttft_s is not None:
        gen = ans.seconds - ans.ttft_s
        if ans.tokens:
            parts.append(f"{ans.tokens} tokens")
        if ans.tokens > 1 and gen > 0:
            parts.append(f"{(ans.tokens - 1) / gen:.1f} tokens/s")
        parts.append(f"first token {ans.ttft_s * 1000:.0f} ms")
    return " · ".join(parts)


def _interactive(chat: Chat) -> None:
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    print(f"chatting with {chat.model}; /? for help, /bye or Ctrl-D to leave")
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print()
            return
        except KeyboardInterrupt:
            print("\nuse /bye or Ctrl-D to leave")
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            if not chat.command(line.strip()):
                return
            continue
        try:
            ans = chat.ask(line)
        except ApiError as exc:
            err.print(f"error: {exc}", markup=False)
            continue
        except (RuntimeError, ValueError) as exc:
            err.print(f"\nerror: {exc}", markup=False)
            continue
        print()
        info = _stats(ans)
        if info:
            err.print(f"[dim]({info})[/]")


def run(model: str = typer.Argument(..., help="model id or alias (`default`: the embedded model)"),
        prompt: list[str] = typer.Argument(None, help="the prompt; without it: stdin, or a chat in a terminal"),
        system: str | None = typer.Option(None, "--system", help="system prompt"),
        temperature: float | None = typer.Option(None, "--temperature", help="sampling temperature"),
        max_tokens: int | None = typer.Option(None, "--max-tokens", help="longest answer in tokens"),
        verbose: bool = typer.Option(False, "--verbose", help="print tokens/s and time to first token"),
        host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt) -> None:
    """Chat with a model: one answer for PROMPT (or piped stdin), else an interactive chat."""
    text = " ".join(prompt or [])
    piped = not sys.stdin.isatty()
    if piped:
        data = sys.stdin.read()
        text = f"{text}\n\n{data}".strip() if text else data.strip()
    options: dict[str, Any] = {}
    if temperature is not None:
        options["temperature"] = temperature
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    with Api(server_url(host, port, server), timeout=None) as api:
        try:
            if sys.stderr.isatty():
                with err.status(f"loading {model}…"):
                    api.post("/models/load", {"model": model})
            else:
                api.post("/models/load", {"model": model})
        except ApiError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        chat = Chat(api, model, system=system, options=options)
        if text or piped:
            if not text:
                fail("nothing to ask: the prompt is empty")
            try:
                ans = chat.ask(text)
            except ApiError as exc:
                fail(str(exc))
            except (RuntimeError, ValueError) as exc:
                fail(str(exc))
            print()
            if verbose:
                err.print(f"({_stats(ans)})", markup=False)
            raise typer.Exit(130 if ans.stopped else 0)
        _interactive(chat)


def register(app: typer.Typer) -> None:
    """Adds this module's commands to the `corral` app."""
    app.command("run")(run)
