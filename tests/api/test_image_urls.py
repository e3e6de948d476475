"""http(s) image URLs (api/core/image_fetch.py): fetched by the router only when
``allow_image_urls`` is on, never from loopback/link-local/private addresses unless
``allow_private_image_urls`` allows them, redirects checked hop by hop, with a size and a
time limit. The image servers here are real sockets on 127.0.0.1 and 127.0.0.2; each
records the connections it got, so a refused fetch is shown to have sent nothing."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import io
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from PIL import Image

from corral.store.address_policy import address_allowed
from support.harness import Harness


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (3, 3), (9, 9, 9)).save(out, "PNG")
    return out.getvalue()


IMG = png()


@dataclass
class ImageServer:
    """A tiny HTTP server: ``routes[path]`` -> (status, headers, body), or "hang" (never answers)."""

    host: str
    routes: dict[str, Any] = field(default_factory=dict)
    hits: list[tuple[str, str]] = field(default_factory=list)  # (path, Host header)
    port: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def url(self, path: str, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}{path}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        path = head[0].split(" ")[1]
        host = next((h.split(":", 1)[1].strip() for h in head[1:] if h.lower().startswith("host:")), "")
        self.hits.append((path, host))
        route = self.routes.get(path, (404, {}, b"no"))
        if route == "hang":
            await self.release.wait()
            writer.close()
            return
        status, headers, body = route
        headers = dict(headers)
        if headers.pop("_no_length", None) is None:  # else the body ends when the connection does
            headers["Content-Length"] = str(len(body))
        lines = [f"HTTP/1.1 {status} X", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        writer.close()


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[str], ImageServer]]:
    started: list[tuple[ImageServer, asyncio.Server]] = []

    async def make(host: str) -> ImageServer:
        s = ImageServer(host)
        srv = await asyncio.start_server(s.handle, host, 0)
        s.port = srv.sockets[0].getsockname()[1]
        started.append((s, srv))
        return s

    yield make  # type: ignore[misc]
    for s, srv in started:
        s.release.set()
        srv.close()
        await srv.wait_closed()


async def start(harness: Harness, **server: Any) -> None:
    (harness.tmp / "mmproj-v.gguf").write_bytes(b"GGUF" + bytes(100))
    await harness.serve({"v": {"path": str(harness.script("v")),
                               "mmproj": str(harness.tmp / "mmproj-v.gguf")}},
                        allow_image_urls=True, **server)


async def ask(harness: Harness, url: str) -> Any:
    return await harness.client.post("/v1/chat/completions", json={"model": "v", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": url}}]}]})


def images_sent(harness: Harness) -> list[bytes]:
    gen = [r for r in harness.requests_seen("v") if r.get("type") == "generate"]
    return [base64.b64decode(s) for s in gen[-1]["messages"][0].get("images") or []] if gen else []


async def test_loopback_is_refused_unless_allowed(harness: Harness, servers: Any) -> None:
    a = await servers("127.0.0.1")
    a.routes["/cat.png"] = (200, {"Content-Type": "image/png"}, IMG)
    await start(harness)
    for url in (a.url("/cat.png"), a.url("/cat.png", "localhost"), f"http://[::ffff:127.0.0.1]:{a.port}/cat.png"):
        r = await ask(harness, url)
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["code"] == "image_url_not_allowed" and err["param"] == "messages.0.content.1"
        assert "127.0.0.1" in err["message"] and "allow_private_image_urls" in err["message"]
    assert a.hits == []  # not one connection
    assert images_sent(harness) == []


async def test_allowed_network_is_fetched_at_the_checked_address(harness: Harness, servers: Any) -> None:
    a = await servers("127.0.0.1")
    a.routes["/cat.png"] = (200, {"Content-Type": "image/png"}, IMG)
    await start(harness, allow_private_image_urls=["127.0.0.1/32"])
    r = await ask(harness, a.url("/cat.png", "localhost"))
    assert r.status_code == 200, r.text
    assert images_sent(harness) == [IMG]
    # the connection went to the address that was checked; the URL's host stayed the Host header
    assert a.hits == [("/cat.png", f"localhost:{a.port}")]


async def test_redirects_are_checked_hop_by_hop(harness: Harness, servers: Any) -> None:
    a = await servers("127.0.0.1")
    b = await servers("127.0.0.2")
    b.routes["/secret"] = (200, {}, IMG)
    a.routes["/to-b"] = (302, {"Location": b.url("/secret")}, b"")
    a.routes["/to-a"] = (301, {"Location": "/cat.png"}, b"")
    a.routes["/cat.png"] = (200, {}, IMG)
    a.routes["/loop"] = (302, {"Location": "/loop"}, b"")
    await start(harness, allow_private_image_urls=["127.0.0.1/32"])
    r = await ask(harness, a.url("/to-b"))
    assert r.status_code == 403 and "127.0.0.2" in r.json()["error"]["message"], r.text
    assert b.hits == []  # the refused target never saw a connection
    r = await ask(harness, a.url("/to-a"))  # a redirect to an allowed place is followed
    assert r.status_code == 200 and images_sent(harness) == [IMG], r.text
    r = await ask(harness, a.url("/loop"))
    assert r.status_code == 400 and "redirected more than" in r.json()["error"]["message"]


async def test_size_time_and_status_limits(harness: Harness, servers: Any) -> None:
    a = await servers("127.0.0.1")
    a.routes["/big"] = (200, {}, bytes(5000))
    a.routes["/big-unsized"] = (200, {"_no_length": "1"}, bytes(5000))
    a.routes["/slow"] = "hang"
    a.routes["/gone"] = (404, {}, b"nope")
    a.routes["/text"] = (200, {}, b"hello, not an image")
    await start(harness, allow_private_image_urls=True, max_image_bytes=1000, image_url_timeout_s=0.5)
    for path in ("/big", "/big-unsized"):
        r = await ask(harness, a.url(path))
        assert r.status_code == 413 and "max_image_bytes" in r.json()["error"]["message"], (path, r.text)
    r = await ask(harness, a.url("/slow"))
    assert r.status_code == 400 and "image_url_timeout_s" in r.json()["error"]["message"], r.text
    r = await ask(harness, a.url("/gone"))
    assert r.status_code == 400 and "HTTP 404" in r.json()["error"]["message"]
    r = await ask(harness, a.url("/text"))
    assert r.status_code == 400 and "not an image" in r.json()["error"]["message"]
    r = await ask(harness, "http://no-such-host.invalid/x.png")
    assert r.status_code == 400 and "cannot resolve" in r.json()["error"]["message"]
    assert images_sent(harness) == []


async def test_anthropic_url_images_follow_the_same_rules(harness: Harness, servers: Any) -> None:
    a = await servers("127.0.0.1")
    a.routes["/cat.png"] = (200, {}, IMG)
    await start(harness)
    body = {"model": "v", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": a.url("/cat.png")}}]}]}
    r = await harness.client.post("/v1/messages", json=body)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
    assert a.hits == []
    r = await harness.client.post("/v1/responses", json={"model": "v", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": a.url("/cat.png")}]}]})
    assert r.status_code == 403 and a.hits == []


@pytest.mark.parametrize(("addr", "ok"), [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False),
    ("::1", False), ("fe80::1", False), ("fd00::1", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False),
    ("::", False), ("::7f00:1", False), ("64:ff9b::7f00:1", False), ("2002:7f00:1::", False),
])
def test_which_addresses_are_private(addr: str, ok: bool) -> None:
    ip = ipaddress.ip_address(addr)
    assert address_allowed(ip, False) is ok
    assert address_allowed(ip, True) is True
    assert address_allowed(ip, [ipaddress.ip_network("10.0.0.0/8")]) is (ok or addr.endswith("10.1.2.3")
                                                                          or addr.endswith("10.0.0.1"))
