"""The page's chat with a model that hears, in Chromium: the microphone (Chromium's fake
capture device, a tone) recorded by the browser's MediaRecorder as WebM/Opus, sent as an
``input_audio`` part, decoded by the router and heard by a real worker with the generated
Qwen2-Audio projector (testkit/gguf_audio.py); an attached WAV file the same way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.audio_files import encode, recording

from .browser import ARGS, chromium_path, key_script
from .server import CorralServer

pytestmark = pytest.mark.integration

KEY = "ui-audio-key-0123"


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory: pytest.TempPathFactory, audio_mmproj_path: Path) -> Iterator[CorralServer]:
    from corral.store.embedded import embedded_model_path

    tmp = tmp_path_factory.mktemp("ui-audio")
    cfg = tmp / "corral.toml"
    cfg.write_text(f'[models.gemma-audio]\npath = "{embedded_model_path()}"\nmmproj = "{audio_mmproj_path}"\n'
                   'ctx_len = 4096\nn_parallel = 1\nthreads = 1\n')
    srv = CorralServer(tmp, api_key=KEY, args=("--config", str(cfg)))
    yield srv
    srv.stop()


@pytest.fixture
def audio_page(playwright: Any, tmp_path: Path, audio_server: CorralServer) -> Iterator[Any]:
    ctx = playwright.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=chromium_path(),
        args=[*ARGS, "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream"],
        headless=True, viewport={"width": 1280, "height": 900}, bypass_csp=True,
        permissions=["microphone"])
    ctx.set_default_timeout(60_000)
    ctx.add_init_script(key_script(KEY))
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(audio_server.url + "/")
    yield page
    ctx.close()
    assert not errors, errors


def test_recorded_and_attached_audio_reach_the_model(audio_page: Any, audio_server: CorralServer,
                                                    tmp_path: Path) -> None:
    page = audio_page

    def used() -> tuple[int, int]:  # this server's usage of the model (its state dir is the session's)
        with audio_server.client() as c:
            rows = c.get("/usage", params={"model": "gemma-audio"}).json()["data"]
        return sum(r["requests"] for r in rows), sum(r["prompt_tokens"] for r in rows)

    before = used()
    page.locator('#chat-model option[value="gemma-audio"]').wait_for(state="attached")
    page.select_option("#chat-model", "gemma-audio")
    page.locator("#chat-record").wait_for(state="visible")
    page.fill("#chat-max-tokens", "2")
    page.fill("#chat-temperature", "0")
    page.click("#chat-record")
    page.locator("#chat-record", has_text="Stop recording").wait_for()
    page.wait_for_timeout(1500)  # the recording's length (not a wait for an event: the tone lasts this long)
    page.click("#chat-record")
    page.locator("#chat-audio", has_text="audio: recording").wait_for()
    page.fill("#chat-input", "What is said?")
    page.click("#chat-send")
    page.locator(".msg.assistant[data-outcome]").wait_for(timeout=180_000)
    answer = page.locator(".msg.assistant").last
    assert answer.get_attribute("data-outcome") == "done", answer.inner_text()
    assert page.locator(".msg.user").last.inner_text().startswith("[recording] What is said?")

    page.click("#chat-clear")  # a new conversation: the server's --ctx-len leaves one recording's room a turn
    wav = tmp_path / "clip.wav"
    wav.write_bytes(encode(recording(1), "wav"))
    page.set_input_files("#chat-audio-file", str(wav))
    page.locator("#chat-audio", has_text="audio: clip.wav").wait_for()
    page.click("#chat-send")
    page.locator('.msg.assistant[data-outcome]').wait_for(timeout=180_000)
    last = page.locator(".msg.assistant").last
    assert last.get_attribute("data-outcome") == "done", last.inner_text()
    with audio_server.client() as c:
        m = next(x for x in c.get("/v1/models").json()["data"] if x["id"] == "gemma-audio")
        assert m["audio"] is True
    # the model heard both: two requests, each with a window's 750 positions in its prompt
    after = used()
    assert after[0] - before[0] == 2 and after[1] - before[1] >= 2 * 750, (before, after)
