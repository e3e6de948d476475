"""A Qwen2-VL model (M-RoPE images) behind the router: the openai client sends images in chat
turns to a real worker with the tiny Qwen2-VL pair (testkit/gguf_qwen2vl.py) and real
libmtmd. The words are meaningless (random weights); the positions are checked against libmtmd
and llama-server elsewhere (tests/worker/media/test_vision_mrope.py, bench/checks/vision_mrope.py):
here, that the router's path reaches them and a cached turn answers as a cold one."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from testkit.gguf_qwen2vl import image_grid
from support.harness import Harness

pytestmark = pytest.mark.integration

W, H = 64, 48


def data_url(seed: int) -> str:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def test_openai_client_sends_images_to_a_qwen2vl_model(harness: Harness, qwen2vl_pair: tuple[Path, Path]) -> None:
    model, mmproj = qwen2vl_pair
    cfg = harness.config({"qwen-vl": {"path": str(model), "mmproj": str(mmproj), "ctx_len": 1024, "n_parallel": 2,
                                      "threads": 1}}, worker_command=None)
    await harness.start(cfg)
    client = openai.AsyncOpenAI(base_url=harness.base_url + "/v1", api_key="unused", max_retries=0)
    assert {m.id: m for m in (await client.models.list()).data}["qwen-vl"].model_extra["vision"] is True  # type: ignore[index]
    nx, ny = image_grid(W, H)

    async def ask(*turns: dict[str, object]) -> tuple[str, int]:
        r = await client.chat.completions.create(model="qwen-vl", max_tokens=6, temperature=0,
                                                 messages=list(turns))  # type: ignore[arg-type]
        assert r.usage is not None and r.choices[0].message.content is not None
        return r.choices[0].message.content, r.usage.prompt_tokens

    text_only = (await ask({"role": "user", "content": "the picture caption:"}))[1]
    turn1 = {"role": "user", "content": [{"type": "text", "text": "the picture"},
                                         {"type": "image_url", "image_url": {"url": data_url(1)}},
                                         {"type": "text", "text": "caption:"}]}
    cold, n_prompt = await ask(turn1)
    assert n_prompt >= text_only + nx * ny  # the image's 48 tokens (and its 8 positions) were in it
    again, _ = await ask(turn1)  # from the slot's cache: the image's cells reused, positions and all
    assert again == cold
    # the next turn: the same image, an answer, a second image
    turn2 = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(2)}},
                                         {"type": "text", "text": "and this one?"}]}
    _, n2 = await ask(turn1, {"role": "assistant", "content": cold}, turn2)
    assert n2 >= n_prompt + nx * ny
