"""Images in every dialect, with fake workers: each API's image blocks reach the worker as
``wire.MEDIA_MARKER``s at their places in the turn's text plus the image bytes in the
turn's ``images`` (api/core/images.py), and every bad image is a 4xx in that API's error
shape naming the image and the problem, before any worker sees the request."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from corral import wire
from support.harness import Harness

M = wire.MEDIA_MARKER


def png(w: int = 4, h: int = 3, color: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), color).save(out, "PNG")
    return out.getvalue()


def encoded(fmt: str, w: int = 5, h: int = 5) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (0, 128, 255)).save(out, fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


RED, BLUE = png(color=(255, 0, 0)), png(6, 2, (0, 0, 255))


async def start(harness: Harness, **server: Any) -> None:
    """Model ``v`` has a projector (the fake worker then reports vision); ``t`` has none."""
    proj = harness.tmp / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "mmproj-v-f16.gguf").write_bytes(b"GGUF" + bytes(1000))
    await harness.serve({"v": {"path": str(harness.script("v")), "mmproj": "proj/mmproj-v-f16.gguf"},
                         "t": {"path": str(harness.script("t"))}}, **server)


def seen_messages(harness: Harness, model: str = "v") -> list[dict[str, Any]]:
    gen = [r for r in harness.requests_seen(model) if r.get("type") == "generate"]
    return gen[-1]["messages"]


def images_of(msg: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(s) for s in msg.get("images") or []]


# ------------------------------------------------------------------ every dialect's translation


async def test_openai_chat_image_parts_become_markers_in_place(harness: Harness) -> None:
    await start(harness)
    body = {"model": "v", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "compare "},
                                     {"type": "image_url", "image_url": {"url": data_url(RED)}},
                                     {"type": "text", "text": " with "},
                                     {"type": "image_url", "image_url": {"url": data_url(BLUE), "detail": "low"}}]},
        {"role": "assistant", "content": "they differ"},
        {"role": "user", "content": [{"type": "image_url", "image_url": data_url(RED)}, {"type": "text", "text": "?"}]}]}
    r = await harness.client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    msgs = seen_messages(harness)
    assert [m["content"] for m in msgs] == ["be brief", f"compare {M} with {M}", "they differ", f"{M}?"]
    assert images_of(msgs[1]) == [RED, BLUE] and images_of(msgs[3]) == [RED]
    assert "images" not in msgs[0] and "images" not in msgs[2]


async def test_openai_chat_streamed_with_images(harness: Harness) -> None:
    await start(harness)
    body = {"model": "v", "stream": True, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(RED)}}, {"type": "text", "text": "what"}]}]}
    async with harness.client.stream("POST", "/v1/chat/completions", json=body) as r:
        text = (await r.aread()).decode()
    assert r.status_code == 200 and "[DONE]" in text
    assert images_of(seen_messages(harness)[0]) == [RED]


async def test_ollama_chat_and_generate_images(harness: Harness) -> None:
    await start(harness)
    c = harness.client
    r = await c.post("/api/chat", json={"model": "v", "stream": False, "messages": [
        {"role": "user", "content": "what is this", "images": [b64(RED), b64(BLUE)]},
        {"role": "assistant", "content": "two squares"},
        {"role": "user", "content": "and this", "images": [b64(BLUE)]}]})
    assert r.status_code == 200, r.text
    msgs = seen_messages(harness)
    assert [m["content"] for m in msgs] == [f"{M}{M}what is this", "two squares", f"{M}and this"]
    assert images_of(msgs[0]) == [RED, BLUE] and images_of(msgs[2]) == [BLUE]
    # generate: the prompt is a user turn with the images before it
    r = await c.post("/api/generate", json={"model": "v", "stream": False, "prompt": "describe",
                                            "images": [b64(RED)]})
    assert r.status_code == 200, r.text
    (turn,) = seen_messages(harness)
    assert turn["content"] == f"{M}describe" and images_of(turn) == [RED]
    # raw generate: the prompt as it is, markers first unless it places them; images on the request
    for prompt, sent in [("look: ", f"{M}{M}look: "), (f"a {M} b {M}", f"a {M} b {M}")]:
        r = await c.post("/api/generate", json={"model": "v", "stream": False, "raw": True, "prompt": prompt,
                                                "images": [b64(RED), b64(BLUE)]})
        assert r.status_code == 200, r.text
        req = [x for x in harness.requests_seen("v") if x.get("type") == "generate"][-1]
        assert req["prompt"] == sent and req.get("messages") is None
        assert [base64.b64decode(s) for s in req["images"]] == [RED, BLUE]
    # images only, no prompt: still a generation (not Ollama's load-the-model call)
    r = await c.post("/api/generate", json={"model": "v", "stream": False, "images": [b64(RED)]})
    assert r.status_code == 200 and r.json()["response"] == "Hello, world!"
    assert seen_messages(harness)[0]["content"] == M


async def test_anthropic_image_blocks(harness: Harness) -> None:
    await start(harness)
    body = {"model": "v", "max_tokens": 16, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "first "},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}},
        {"type": "text", "text": " then "},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(BLUE)}}]}]}
    r = await harness.client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    (turn,) = seen_messages(harness)
    assert turn["content"] == f"first {M} then {M}" and images_of(turn) == [RED, BLUE]
    # count_tokens sends the images too (the worker counts their tokens)
    r = await harness.client.post("/v1/messages/count_tokens", json={k: v for k, v in body.items()
                                                                      if k != "max_tokens"})
    assert r.status_code == 200, r.text
    assert images_of(seen_messages(harness)[0]) == [RED, BLUE]


async def test_responses_input_image(harness: Harness) -> None:
    await start(harness)
    body = {"model": "v", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "see"}, {"type": "input_image", "image_url": data_url(RED), "detail": "auto"}]}]}
    r = await harness.client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    (turn,) = seen_messages(harness)
    assert turn["content"] == f"see{M}" and images_of(turn) == [RED]
    # the stored conversation keeps the image: the next turn sends it again
    r2 = await harness.client.post("/v1/responses", json={"model": "v", "previous_response_id": r.json()["id"],
                                                          "input": "and now?"})
    assert r2.status_code == 200, r2.text
    msgs = seen_messages(harness)
    assert msgs[0]["content"] == f"see{M}" and images_of(msgs[0]) == [RED] and msgs[-1]["content"] == "and now?"


async def test_formats_the_engine_does_not_read_become_png(harness: Harness) -> None:
    await start(harness)
    jpeg, webp = encoded("JPEG"), encoded("WEBP")
    parts = [{"type": "image_url", "image_url": {"url": data_url(d)}} for d in (jpeg, webp)]
    r = await harness.client.post("/v1/chat/completions", json={"model": "v", "messages": [
        {"role": "user", "content": parts}]})
    assert r.status_code == 200, r.text
    sent = images_of(seen_messages(harness)[0])
    assert sent[0] == jpeg  # JPEG as it came
    with Image.open(io.BytesIO(sent[1])) as im:  # WebP re-encoded as PNG, same pixels' size
        assert im.format == "PNG" and im.size == (5, 5)


# ------------------------------------------------------------------ bad input: 4xx naming the image


def truncated_png() -> bytes:
    return png(64, 64)[:-40]


def bomb_png() -> bytes:
    """A tiny file whose header says 20000 x 20000 pixels."""
    out = io.BytesIO()
    Image.new("1", (20000, 20000)).save(out, "PNG")
    return out.getvalue()


BAD = [
    (b"this is plain text, not a picture", 400, "not an image"),
    (truncated_png(), 400, "truncated"),
    (b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic", 400, "HEIC is not supported"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'/>", 400, "SVG"),
    (bomb_png(), 400, "pixels"),
    (b"", 400, "empty"),
]


@pytest.mark.parametrize(("data", "status", "words"), BAD, ids=["text", "truncated", "heic", "svg", "bomb", "empty"])
async def test_bad_images_are_4xx_naming_the_image_in_every_dialect(harness: Harness, data: bytes, status: int,
                                                                  words: str) -> None:
    await start(harness, max_image_pixels=10_000_000)
    c = harness.client
    good = {"type": "image_url", "image_url": {"url": data_url(RED)}}
    bad = {"type": "image_url", "image_url": {"url": data_url(data)}}
    r = await c.post("/v1/chat/completions", json={"model": "v", "messages": [
        {"role": "user", "content": [good]}, {"role": "user", "content": [{"type": "text", "text": "x"}, bad]}]})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == "messages.1.content.1" and words in err["message"] and err["code"] == "invalid_image", err
    r = await c.post("/api/chat", json={"model": "v", "messages": [
        {"role": "user", "content": "x", "images": [b64(RED), b64(data)]}]})
    assert r.status_code == status and set(r.json()) == {"error"}, r.text
    assert r.json()["error"].startswith("messages.0.images.1:") and words in r.json()["error"]
    r = await c.post("/api/generate", json={"model": "v", "prompt": "x", "images": [b64(data)]})
    assert r.status_code == status and r.json()["error"].startswith("images.0:"), r.text
    r = await c.post("/v1/messages", json={"model": "v", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}]}]})
    assert r.status_code == status and r.json()["type"] == "error", r.text
    assert r.json()["error"]["message"].startswith("messages.0.content.0:") and words in r.json()["error"]["message"]
    r = await c.post("/v1/responses", json={"model": "v", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": data_url(data)}]}]})
    assert r.status_code == status and r.json()["error"]["param"] == "input.0.content.0", r.text
    # nothing reached the worker, and it still answers
    assert not [x for x in harness.requests_seen("v") if x.get("type") == "generate"]
    r = await c.post("/v1/chat/completions", json={"model": "v", "messages": [{"role": "user", "content": [good]}]})
    assert r.status_code == 200


async def test_other_bad_image_requests(harness: Harness) -> None:
    await start(harness, max_image_bytes=1000)
    c = harness.client

    async def chat(part: dict[str, Any], model: str = "v") -> Any:
        return await c.post("/v1/chat/completions", json={"model": model, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}, part]}]})

    img = {"type": "image_url", "image_url": {"url": data_url(RED)}}
    r = await chat(img, "t")  # a model without a projector
    assert r.status_code == 400 and r.json()["error"]["code"] == "vision_not_supported", r.text
    assert "'t' does not read images" in r.json()["error"]["message"]
    r = await c.post("/api/chat", json={"model": "t", "messages": [{"role": "user", "content": "x",
                                                                   "images": [b64(RED)]}]})
    assert r.status_code == 400 and "does not read images" in r.json()["error"]
    r = await c.post("/v1/messages", json={"model": "t", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(RED)}}]}]})
    assert r.status_code == 400 and "does not read images" in r.json()["error"]["message"]
    noisy = Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3))  # ~12 KB of PNG: over 1000 bytes
    buf = io.BytesIO()
    noisy.save(buf, "PNG")
    r = await chat({"type": "image_url", "image_url": {"url": data_url(buf.getvalue())}})
    assert r.status_code == 413 and "max_image_bytes" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages.0.content.1"
    r = await chat({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@not base64@@@"}})
    assert r.status_code == 400 and "base64" in r.json()["error"]["message"]
    r = await chat({"type": "image_url", "image_url": {"url": "data:image/png," + "x" * 10}})
    assert r.status_code == 400 and "base64" in r.json()["error"]["message"]
    r = await chat({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}})
    assert r.status_code == 400 and "data: URL" in r.json()["error"]["message"]
    # image URLs are off by default: 403 naming the setting
    r = await chat({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}})
    assert r.status_code == 403 and "allow_image_urls" in r.json()["error"]["message"], r.text
    # a marker typed into the text would misplace the images
    r = await c.post("/v1/chat/completions", json={"model": "v", "messages": [
        {"role": "user", "content": [{"type": "text", "text": f"sneaky {M}"}, img]}]})
    assert r.status_code == 400 and "marks" in r.json()["error"]["message"], r.text
    r = await c.post("/api/generate", json={"model": "v", "raw": True, "prompt": f"{M}{M}", "images": [b64(RED)]})
    assert r.status_code == 400 and "markers" in r.json()["error"], r.text
    # images and fill-in-the-middle do not combine; unknown part types and file ids are named
    r = await c.post("/api/generate", json={"model": "v", "prompt": "a", "suffix": "b", "images": [b64(RED)]})
    assert r.status_code == 400 and "suffix" in r.json()["error"]
    r = await c.post("/v1/responses", json={"model": "v", "input": [{"role": "user", "content": [
        {"type": "input_image", "file_id": "file-1"}]}]})
    assert r.status_code == 400 and "file_id" in r.json()["error"]["message"]
    r = await c.post("/v1/messages", json={"model": "v", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]})
    assert r.status_code == 400 and "source" in r.json()["error"]["message"]
    r = await c.post("/api/chat", json={"model": "v", "messages": [{"role": "user", "content": "x", "images": [5]}]})
    assert r.status_code == 400 and "base64 string" in r.json()["error"]
    assert not [x for x in harness.requests_seen("v") if x.get("type") == "generate"]


async def test_vision_shows_in_model_listings(harness: Harness, tmp_path: Path) -> None:
    await start(harness)
    c = harness.client
    models = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert models["v"]["vision"] is True and models["v"]["mmproj"].endswith("proj/mmproj-v-f16.gguf")
    assert models["t"]["vision"] is False and models["t"]["mmproj"] is None
    v1 = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
    assert v1["v"]["vision"] is True and v1["t"]["vision"] is False
    assert "vision" in (await c.post("/api/show", json={"model": "v"})).json()["capabilities"]
    assert "vision" not in (await c.post("/api/show", json={"model": "t"})).json()["capabilities"]
    # loaded, the instance's report says it (the fake reports vision when given a projector)
    assert (await c.post("/models/load", json={"model": "v"})).status_code == 200
    assert (await c.get("/v1/models/v")).json()["vision"] is True
    settings = (tmp_path / "v.json.settings").read_text()
    assert "mmproj-v-f16.gguf" in settings
