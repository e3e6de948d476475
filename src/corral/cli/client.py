"""The command line as a client of a running corral server: where it is, the API key,
and errors a person can act on (never a traceback).

Address: ``--host``/``--port``, else ``CORRAL_HOST`` (``HOST``, ``HOST:PORT`` or a URL,
like ``OLLAMA_HOST``), else ``CORRAL_SERVER`` (a URL; older name), else 127.0.0.1:8080.
API key: ``CORRAL_API_KEY`` (sent as ``Authorization: Bearer``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, NoReturn
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.text import Text

__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "HostOpt", "PortOpt", "ServerOpt", "Api", "ApiError",
           "server_url", "api_headers", "error_message", "fail", "model_path", "quote_id"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

err = Console(stderr=True, highlight=False)

HostOpt = typer.Option(None, "--host", help="corral server host, HOST:PORT or URL "
                       f"(default: $CORRAL_HOST or {DEFAULT_HOST})", show_default=False)
PortOpt = typer.Option(None, "--port", help=f"corral server port (default: {DEFAULT_PORT})",
                       show_default=False)
ServerOpt = typer.Option(None, "--server", help="corral server URL (overrides --host/--port)",
                         hidden=True)


def server_url(host: str | None = None, port: int | None = None, server: str | None = None) -> str:
    """The base URL of the server the command talks to (no trailing slash)."""
    if server:
        return server.rstrip("/")
    spec = host or os.environ.get("CORRAL_HOST")
    if not spec:
        legacy = os.environ.get("CORRAL_SERVER")
        if legacy and port is None:
            return legacy.rstrip("/")
        spec = DEFAULT_HOST
    spec = spec.strip().rstrip("/")
    scheme = "http"
    if "://" in spec:
        scheme, spec = spec.split("://", 1)
    hostpart, portpart = spec, ""
    if spec.startswith("["):  # [v6 address]:port
        end = spec.find("]")
        hostpart, rest = spec[:end + 1], spec[end + 1:]
        portpart = rest[1:] if rest.startswith(":") else ""
    elif spec.count(":") == 1:
        hostpart, portpart = spec.split(":")
    if port is None and portpart.isdigit():
        port = int(portpart)
    if hostpart in ("", "0.0.0.0"):
        hostpart = DEFAULT_HOST  # a listen-on-all address: talk to it on loopback
    if hostpart == "::" or hostpart == "[::]":
        hostpart = "[::1]"
    return f"{scheme}://{hostpart}:{port or DEFAULT_PORT}"


def api_headers() -> dict[str, str]:
    key = os.environ.get("CORRAL_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def quote_id(model_id: str) -> str:
    """A model id as one URL path segment ('/' and ':' escaped)."""
    return quote(model_id, safe="")


def model_path(prefix: str, model_id: str) -> str:
    return f"{prefix}/{quote_id(model_id)}"


def error_message(r: httpx.Response) -> str:
    with contextlib.suppress(ValueError, KeyError, TypeError):
        error = r.json()["error"]
        return error if isinstance(error, str) else str(error["message"])  # Ollama's routes: a string
    return f"HTTP {r.status_code}: {r.text[:200]}"


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(Text("error: ", style="red") + Text(message), soft_wrap=True)
    raise typer.Exit(code)


class ApiError(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(error_message(response))
        self.response = response
        self.status = response.status_code


class Api:
    """A small synchronous client; every method exits with one line when no server answers."""

    def __init__(self, url: str, *, timeout: float | None = 30.0) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, headers=api_headers(), timeout=timeout)

    def __enter__(self) -> "Api":
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def no_server(self) -> NoReturn:
        err.print(f"corral: no server answers at {self.url}; start one with `corral serve` "
                  "(or point --host/--port or CORRAL_HOST at it)", markup=False, soft_wrap=True)
        raise typer.Exit(1)

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.ConnectError:
            self.no_server()
        except httpx.TimeoutException:
            fail(f"the server at {self.url} did not answer in time")
        except httpx.HTTPError as exc:
            fail(f"talking to {self.url}: {exc}")
        if r.status_code == 401:
            fail("the server refused the API key: set CORRAL_API_KEY to the server's --api-key")
        if r.status_code >= 400:
            raise ApiError(r)
        return r.json()

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: dict[str, Any], **kw: Any) -> Any:
        return self.request("POST", path, json=body, **kw)

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[httpx.Response]:
        try:
            with self.client.stream(method, path, **kw) as r:
                if r.status_code == 401:
                    fail("the server refused the API key: set CORRAL_API_KEY to the server's --api-key")
                if r.status_code >= 400:
                    r.read()
                    raise ApiError(r)
                yield r
        except httpx.ConnectError:
            self.no_server()

    def models(self) -> list[dict[str, Any]]:
        data = self.get("/models")
        return list(data.get("data", []))
