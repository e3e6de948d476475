"""Load attacks replayed: a heavy key's queued requests must be slowed, never failed
after their wait; a request's images are bounded (count, bytes, formats, pixels) before
they cost the router or the worker memory (issue 33, parts 7 and 8)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
from collections.abc import AsyncIterator
from typing import Any
from unittest import mock

import httpx
from PIL import Image

from support.harness import Harness, _until

LOAD_BOUND_S = 0.3  # [server] queue_timeout_s: bounds a load's wait for room, no longer a request's


async def test_a_request_queued_past_queue_timeout_s_still_completes(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a")), "n_parallel": 1}},
                         queue_timeout_s=LOAD_BOUND_S)
    plane = await harness.start(cfg)
    c = harness.client
    pool = plane.pools["a"]
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: pool.inflight == 1)
        queued = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "x"}))
        await _until(lambda: len(pool.waiters) == 1)
        # the passage of time is what is tested: before, the wait failed 503 at queue_timeout_s
        await asyncio.sleep(LOAD_BOUND_S * 4)
        assert not queued.done() and len(pool.waiters) == 1
    # the long generation ended (its client closed the stream): the queued request is served
    r = await queued
    assert r.status_code == 200, r.text
    # a queued request whose client leaves is removed from the queue, as before
    async with c.stream("POST", "/v1/completions", json={"model": "a", "prompt": "FOREVER", "stream": True}):
        await _until(lambda: pool.inflight == 1)
        leaving = asyncio.create_task(c.post("/v1/completions", json={"model": "a", "prompt": "y"}))
        await _until(lambda: len(pool.waiters) == 1)
        leaving.cancel()
        await _until(lambda: len(pool.waiters) == 0)
        assert pool.inflight == 1
    await _until(lambda: pool.inflight == 0)
    assert [x["prompt"] for x in harness.requests_seen("a") if "prompt" in x].count("y") == 0


# ------------------------------------------------------------------ images: count, bytes, pixels, formats


def _png(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.new("1", (w, h)).save(out, "PNG")  # a bitmap of w x h in a few hundred bytes
    return out.getvalue()


def _noise_png(side: int) -> bytes:
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, "PNG")
    return out.getvalue()


def _url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


async def _start_vision(harness: Harness, **server: Any) -> None:
    proj = harness.tmp / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "mmproj-v-f16.gguf").write_bytes(b"GGUF" + bytes(1000))
    await harness.serve({"v": {"path": str(harness.script("v")),
                               "mmproj": "proj/mmproj-v-f16.gguf"}}, **server)


def _generated(harness: Harness) -> list[dict[str, Any]]:
    return [r for r in harness.requests_seen("v") if r.get("type") == "generate"]


async def _ask(harness: Harness, urls: list[str]) -> dict[str, httpx.Response]:
    """The same images in each dialect (OpenAI's URL parts; Ollama and Anthropic inline only)."""
    c = harness.client
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    out = {"openai": await c.post("/v1/chat/completions", json={"model": "v", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x"}, *parts]}]})}
    if all(u.startswith("data:") for u in urls):
        raw = [u.partition(",")[2] for u in urls]
        out["ollama"] = await c.post("/api/chat", json={"model": "v", "messages": [
            {"role": "user", "content": "x", "images": raw}]})
        out["anthropic"] = await c.post("/v1/messages", json={"model": "v", "max_tokens": 4, "messages": [
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                     "data": d}} for d in raw]}]})
    return out


def _message(dialect: str, r: httpx.Response) -> str:
    body = r.json()
    if dialect == "ollama":
        assert set(body) == {"error"}, body
        return str(body["error"])
    if dialect == "anthropic":
        assert body["type"] == "error", body
    return str(body["error"]["message"])


async def test_too_many_images_are_refused_before_any_is_fetched(harness: Harness) -> None:
    async with _image_server(_png(8, 8)) as (base, hits):
        await _start_vision(harness, allow_image_urls=True, allow_private_image_urls=True)
        urls = [f"{base}/{i}.png" for i in range(40)]  # over max_images_per_request (32)
        rs = await _ask(harness, urls)
        assert rs["openai"].status_code == 400, rs["openai"].text
        assert "max_images_per_request" in _message("openai", rs["openai"])
        assert hits == []  # nothing was fetched
        rs = await _ask(harness, [_url(_png(8, 8))] * 40)
        for dialect, r in rs.items():
            assert r.status_code == 400 and "max_images_per_request" in _message(dialect, r), (dialect, r.text)
        assert _generated(harness) == []


async def test_fetched_images_stop_at_the_request_byte_bound(harness: Harness) -> None:
    big = _noise_png(300)  # ~270 KB each, under max_image_bytes
    async with _image_server(big) as (base, hits):
        await _start_vision(harness, allow_image_urls=True, allow_private_image_urls=True,
                            max_image_bytes_per_request=len(big) * 3)
        rs = await _ask(harness, [f"{base}/{i}.png" for i in range(30)])
        r = rs["openai"]
        assert r.status_code == 413, r.text
        assert "max_image_bytes_per_request" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "messages.0.content.4"  # the fourth image went over
        assert len(hits) == 4  # the fetches stopped there: 26 URLs were never asked for
        rs = await _ask(harness, [f"{base}/{i}.png" for i in range(3)])  # within the bound: served
        assert rs["openai"].status_code == 200, rs["openai"].text


async def test_inline_images_over_the_request_byte_bound_are_413_in_every_dialect(harness: Harness) -> None:
    big = _noise_png(100)  # ~30 KB
    await _start_vision(harness, max_image_bytes_per_request=len(big) * 2)
    rs = await _ask(harness, [_url(big)] * 3)
    for dialect, r in rs.items():
        assert r.status_code == 413 and "max_image_bytes_per_request" in _message(dialect, r), (dialect, r.text)
    assert _generated(harness) == []
    rs = await _ask(harness, [_url(big)] * 2)
    assert all(r.status_code == 200 for r in rs.values()), {d: r.text for d, r in rs.items()}


async def test_images_over_the_request_pixel_bound_are_refused_before_decoding(harness: Harness) -> None:
    """12 images of 7000x7000 (each under max_image_pixels) grew the worker by ~2 GiB."""
    side = 7000
    await _start_vision(harness)
    rs = await _ask(harness, [_url(_png(side, side))] * 12)
    for dialect, r in rs.items():
        assert r.status_code == 400 and "max_image_pixels_per_request" in _message(dialect, r), (dialect, r.text)
    assert _generated(harness) == []  # the worker saw none of them


async def test_eps_and_other_formats_outside_the_allow_list_are_refused(harness: Harness) -> None:
    """EPS reached Ghostscript through Pillow: no plugin but PNG, JPEG, WebP, GIF and BMP
    may parse request bytes."""
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    tiff = io.BytesIO()
    Image.new("RGB", (4, 4)).save(tiff, "TIFF")
    from PIL import EpsImagePlugin, TiffImagePlugin  # noqa: F401 - registered, so a patch reaches them

    await _start_vision(harness)
    with mock.patch("PIL.EpsImagePlugin.EpsImageFile._open", side_effect=AssertionError("EPS parsed")), \
            mock.patch("PIL.TiffImagePlugin.TiffImageFile._open", side_effect=AssertionError("TIFF parsed")):
        for data, name in ((eps, "EPS"), (tiff.getvalue(), "TIFF")):
            rs = await _ask(harness, [_url(data)])
            for dialect, r in rs.items():
                assert r.status_code == 400 and name in _message(dialect, r), (dialect, r.text)
    assert _generated(harness) == []


@contextlib.asynccontextmanager
async def _image_server(body: bytes) -> AsyncIterator[tuple[str, list[str]]]:
    """A loopback HTTP server answering ``body`` (a PNG) at every path; yields its base URL
    and the paths asked for."""
    hits: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        hits.append(head.split(b" ")[1].decode())
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: image/png\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        try:
            await writer.drain()
        except ConnectionError:
            pass  # the router stopped reading at its bound
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", hits
    finally:
        srv.close()
