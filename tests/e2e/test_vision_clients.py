"""The official openai, ollama and anthropic clients send images to corral and get answers:
the router's translations and checks (api/core/images.py) in front of a real worker with the
embedded Gemma 3 and a real (random-weight) Gemma 3 projector (testkit/gguf_vision.py),
real libmtmd. The words are meaningless (random weights); that the image reached the
model shows in the prompt's token count (an image is ``image_tokens()`` positions)."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

import anthropic
import numpy as np
import ollama
import openai
import pytest
from PIL import Image

from testkit.gguf_vision import image_tokens
from support.harness import Harness

pytestmark = pytest.mark.integration

N_IMG = image_tokens()


def picture(seed: int, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


async def start(harness: Harness, model_path: Path, mmproj_path: Path, **server: Any) -> None:
    cfg = harness.config({"gemma-vision": {"path": str(model_path), "mmproj": str(mmproj_path), "ctx_len": 1024,
                                           "n_parallel": 2, "threads": 1},
                          "gemma-text": {"path": str(model_path), "mmproj": "", "ctx_len": 512, "n_parallel": 1,
                                         "threads": 1}},
                         worker_command=None, **server)
    await harness.start(cfg)


async def test_openai_client_sends_images(harness: Harness, model_path: Path, mmproj_path: Path) -> None:
    await start(harness, model_path, mmproj_path)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
    models = {m.id: m for m in (await client.models.list()).data}
    assert models["gemma-vision"].model_extra["vision"] is True  # type: ignore[index]
    assert models["gemma-text"].model_extra["vision"] is False  # type: ignore[index]

    text_only = await client.chat.completions.create(
        model="gemma-vision", max_tokens=4, temperature=0, messages=[{"role": "user", "content": "Describe it."}])
    r = await client.chat.completions.create(model="gemma-vision", max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                     {"type": "image_url", "image_url": {"url": data_url(picture(1))}}]}])
    assert r.choices[0].message.content is not None and r.usage is not None and text_only.usage is not None
    assert r.usage.prompt_tokens >= text_only.usage.prompt_tokens + N_IMG  # the image's positions were in it
    # two images in one message and one more in the next turn; streamed
    pieces = []
    stream = await client.chat.completions.create(model="gemma-vision", max_tokens=4, temperature=0, stream=True,
                                                  stream_options={"include_usage": True}, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture(2))}},
                                     {"type": "text", "text": "and"},
                                     {"type": "image_url", "image_url": {"url": data_url(picture(3, "JPEG"),
                                                                                          "image/jpeg")}}]},
        {"role": "assistant", "content": "Two pictures."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture(4))}},
                                     {"type": "text", "text": "This one?"}]}])
    usage = None
    async for chunk in stream:
        pieces += [c.delta.content or "" for c in chunk.choices]
        usage = chunk.usage or usage
    assert usage is not None and usage.prompt_tokens >= 3 * N_IMG and "".join(pieces)

    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="gemma-vision", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(b"not a picture")}}]}])
    assert bad.value.code == "invalid_image" and "messages.0.content.0: not an image" in bad.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        await client.chat.completions.create(model="gemma-text", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture(1))}}]}])
    assert bad.value.code == "vision_not_supported"
    # the Responses API's input_image
    resp = await client.responses.create(model="gemma-vision", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "What is it?"},
                                     {"type": "input_image", "image_url": data_url(picture(5)), "detail": "auto"}]}])
    assert resp.status in ("completed", "incomplete") and resp.usage is not None
    assert resp.usage.input_tokens >= N_IMG


async def test_ollama_client_sends_images(harness: Harness, model_path: Path, mmproj_path: Path) -> None:
    await start(harness, model_path, mmproj_path)
    client = ollama.AsyncClient(host=harness.base_url)
    show = await client.show("gemma-vision")
    assert "vision" in (show.capabilities or [])
    assert "vision" not in ((await client.show("gemma-text")).capabilities or [])
    # the client takes raw bytes (and paths) and sends base64
    r = await client.chat(model="gemma-vision", options={"num_predict": 4, "temperature": 0}, messages=[
        {"role": "user", "content": "What is in these?", "images": [picture(6), picture(7)]}])
    assert r.done and r.prompt_eval_count is not None and r.prompt_eval_count >= 2 * N_IMG
    g = await client.generate(model="gemma-vision", prompt="Describe:", images=[picture(8)],
                              options={"num_predict": 4, "temperature": 0})
    assert g.done and g.prompt_eval_count is not None and g.prompt_eval_count >= N_IMG
    with pytest.raises(ollama.ResponseError) as bad:
        await client.chat(model="gemma-vision", messages=[{"role": "user", "content": "x",
                                                          "images": [picture(9)[:-30]]}])
    assert bad.value.status_code == 400 and "messages.0.images.0" in bad.value.error


async def test_anthropic_client_sends_images(harness: Harness, model_path: Path, mmproj_path: Path) -> None:
    await start(harness, model_path, mmproj_path)
    client = anthropic.AsyncAnthropic(base_url=harness.base_url, api_key="unused", max_retries=0)
    b64 = base64.b64encode(picture(10)).decode()
    m = await client.messages.create(model="gemma-vision", max_tokens=4, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": "What is this?"}]}])
    assert m.role == "assistant" and m.usage.input_tokens >= N_IMG
    count = await client.messages.count_tokens(model="gemma-vision", messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
            {"type": "text", "text": "What is this?"}]}])
    assert count.input_tokens == m.usage.input_tokens
    with pytest.raises(anthropic.PermissionDeniedError) as denied:  # URL images are off by default
        await client.messages.create(model="gemma-vision", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1:9/cat.png"}}]}])
    assert "allow_image_urls" in str(denied.value)


async def test_an_allowed_image_url_reaches_the_model(harness: Harness, model_path: Path, mmproj_path: Path) -> None:
    img = picture(11)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\nContent-Length: "
                     + str(len(img)).encode() + b"\r\n\r\n" + img)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        await start(harness, model_path, mmproj_path, allow_image_urls=True, allow_private_image_urls=["127.0.0.1/32"])
        client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
        r = await client.chat.completions.create(model="gemma-vision", max_tokens=4, temperature=0, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{port}/c.png"}},
                                         {"type": "text", "text": "?"}]}])
        assert r.usage is not None and r.usage.prompt_tokens >= N_IMG
    finally:
        srv.close()
        await srv.wait_closed()
