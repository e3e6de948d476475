"""The web page at / in a real browser (Chromium via Playwright) against a real server."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from store.conftest import small_gguf
from store.fake_hub import FakeHub

from .browser import key_script
from .conftest import EXTRA_MODELS, KEY
from .server import CorralServer

pytestmark = pytest.mark.integration

DEFAULT = "gemma-3-270m"


def card(page: Any, model_id: str) -> Any:
    return page.locator(f'article.model[data-model="{model_id}"]')


def status(page: Any, model_id: str) -> Any:
    return card(page, model_id).locator(".model-head .status")


def test_the_page_and_its_assets_need_no_key_but_data_routes_do(server: CorralServer) -> None:
    import httpx

    for path in ("/", "/ui/app.js", "/ui/app.css", "/ui/models.js", "/ui/chat.js"):
        r = httpx.get(server.url + path)
        assert r.status_code == 200, path
        assert "corral" in r.text or path != "/"
    # an unknown asset is not public (the list is fixed): without the key, 401 like any route
    assert httpx.get(server.url + "/ui/nope.js").status_code == 401
    missing = httpx.get(server.url + "/ui/nope.js", headers=server.headers)
    assert missing.status_code == 404, missing.text
    assert "no such asset" in missing.json()["error"]["message"]
    for path in ("/models", "/models/events", "/stats", "/models/show?model=default"):
        assert httpx.get(server.url + path).status_code == 401, path
    html = httpx.get(server.url + "/").text
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith(("/ui/", "#")) for r in refs), refs  # no CDN: every asset is local


def test_a_missing_or_wrong_key_is_reported(browser_context: Any, server: CorralServer) -> None:
    page = browser_context.new_page()
    page.goto(server.url + "/")
    panel = page.locator("#key-panel")
    panel.wait_for(state="visible")
    assert "needs an API key" in page.locator("#key-message").inner_text()
    page.fill("#key-input", "not-the-key")
    page.click("#key-form button[type=submit]")
    page.wait_for_function("document.getElementById('key-message').textContent.includes('wrong key')")
    assert panel.is_visible()
    assert "refused" in page.locator("#key-message").inner_text()
    assert page.locator("#conn").inner_text() == "API key needed"
    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    status(page, DEFAULT).wait_for()
    assert not panel.is_visible()
    assert page.evaluate("localStorage.getItem('corral.apiKey')") == KEY
    page.locator("#conn", has_text="live").wait_for()
    # asked once: a new page in the same browser goes straight to the models
    again = browser_context.new_page()
    again.goto(server.url + "/")
    status(again, DEFAULT).wait_for()
    assert not again.locator("#key-panel").is_visible()


def test_models_listed_and_load_unload_update_live(page: Any, server: CorralServer) -> None:
    status(page, DEFAULT).wait_for()
    assert page.locator("article.model").count() >= EXTRA_MODELS
    assert "aka default" in card(page, DEFAULT).inner_text()
    assert status(page, DEFAULT).inner_text() == "unloaded"
    page.evaluate("window.__notReloaded = true")
    card(page, DEFAULT).locator("button[data-action=load]").click()
    page.wait_for_function(f"""document.querySelector('article.model[data-model="{DEFAULT}"] .model-head .status')
                              .dataset.status === 'loaded'""", timeout=120_000)
    inst = card(page, DEFAULT).locator(".instances li").first
    text = inst.inner_text()
    assert "ready" in text and "pid" in text and "slots 0/2" in text and "RSS" in text
    assert "MiB" in text and "restarts 0" in text
    card(page, DEFAULT).locator("button[data-action=unload]").click()
    page.wait_for_function(f"""document.querySelector('article.model[data-model="{DEFAULT}"] .model-head .status')
                              .dataset.status === 'unloaded'""")
    assert page.evaluate("window.__notReloaded") is True  # updated by the event stream


def test_delete_asks_first(page: Any, server: CorralServer) -> None:
    victim = next(server.models_dir.glob("*-29-*.gguf")).stem
    status(page, victim).wait_for()
    asked: list[str] = []

    def answer(accept: bool) -> Any:
        def on_dialog(d: Any) -> None:
            asked.append(d.message)
            d.accept() if accept else d.dismiss()
        return on_dialog

    page.once("dialog", answer(False))
    card(page, victim).locator("button[data-action=delete]").click()
    assert asked and victim in asked[0]
    assert (server.models_dir / f"{victim}.gguf").exists() and card(page, victim).count() == 1
    page.once("dialog", answer(True))
    card(page, victim).locator("button[data-action=delete]").click()
    card(page, victim).wait_for(state="detached")  # gone through the model_removed event
    assert not (server.models_dir / f"{victim}.gguf").exists()
    assert card(page, DEFAULT).locator("button[data-action=delete]").count() == 0  # not a stored model


def test_a_load_failure_shows_the_reason(page: Any, server: CorralServer) -> None:
    bad = next(server.models_dir.glob("*-00-*.gguf")).stem
    card(page, bad).locator("button[data-action=load]").click()
    card(page, bad).locator(".reason").wait_for(timeout=60_000)
    assert status(page, bad).inner_text() == "failed"
    assert card(page, bad).locator(".reason").inner_text().strip()


def _chat(page: Any, text: str, max_tokens: int) -> None:
    page.select_option("#chat-model", DEFAULT)
    page.fill("#chat-max-tokens", str(max_tokens))
    page.fill("#chat-temperature", "0")
    page.fill("#chat-input", text)
    page.click("#chat-send")


def test_chat_streams_an_answer_with_speed_and_ttft(page: Any) -> None:
    status(page, DEFAULT).wait_for()
    _chat(page, "Write the numbers from 1 to 50, separated by commas.", 12)
    page.locator(".msg.assistant[data-outcome]").wait_for(timeout=120_000)
    answer = page.locator(".msg.assistant").last
    assert answer.get_attribute("data-outcome") == "done"
    assert answer.locator(".text").inner_text().strip()
    stats = page.locator("#chat-stats").inner_text()
    assert "tokens/s" in stats and "TTFT" in stats and "tokens" in stats
    assert page.locator(".msg.user").last.inner_text().startswith("Write the numbers")
    # the model's live charts (GET /stats) show up once it has slots
    card(page, DEFAULT).locator(".charts:not([hidden]) canvas").first.wait_for()
    assert card(page, DEFAULT).locator(".charts .chart").count() == 3


def test_stop_aborts_the_answer_and_frees_the_slot(page: Any, server: CorralServer) -> None:
    status(page, DEFAULT).wait_for()
    _chat(page, "Count from 1 to 5000: 1, 2, 3, 4, 5, 6, 7,", 4000)
    answer = page.locator(".msg.assistant.streaming")
    page.wait_for_function("(document.querySelector('.msg.assistant.streaming .text') || {}).textContent"
                           " && document.querySelector('.msg.assistant.streaming .text').textContent.length > 5",
                           timeout=120_000)
    assert not page.locator("#chat-stop").is_disabled()
    page.click("#chat-stop")
    page.locator('.msg.assistant[data-outcome="stopped"]').wait_for()
    assert answer.count() == 0
    assert "stopped" in page.locator("#chat-stats").inner_text()
    assert not page.locator("#chat-send").is_disabled()
    # the server ended the request: the slot is free again (the abort is not a timer)
    with server.client() as c:
        deadline = time.monotonic() + 20
        while True:
            m = next(x for x in c.get("/models").json()["data"] if x["id"] == DEFAULT)
            busy = sum(i["slots"]["busy"] for i in m["instances"])
            if busy == 0:
                break
            assert time.monotonic() < deadline, "the slot stayed busy after stop"
            time.sleep(0.1)  # nothing to await: /models is a snapshot


def test_pull_shows_progress_and_cancel(page: Any, file_server: FakeHub) -> None:
    f = file_server.add("plain/slow-model-Q8_0.gguf", small_gguf(3_000_000, seed=7))
    f.behavior.bytes_per_s = 150_000
    status(page, DEFAULT).wait_for()
    page.fill("#pull-source", f"{file_server.url}/plain/slow-model-Q8_0.gguf")
    page.click("#pull-button")
    dl = page.locator('.download[data-state="downloading"]')
    dl.wait_for()
    page.wait_for_function("/ETA \\d/.test((document.querySelector('.download .dl-line') || {}).textContent || '')")
    line = dl.locator(".dl-line").inner_text()
    assert "of 2.86 MiB" in line and "/s" in line and "%" in line
    width = dl.locator(".progress > div").evaluate("e => parseFloat(e.style.width)")
    assert width > 0
    # the model's card shows it downloading too
    status(page, "slow-model-Q8_0").wait_for()
    assert status(page, "slow-model-Q8_0").inner_text() == "downloading"
    dl.locator("button", has_text="Cancel").click()
    page.locator('.download[data-state="cancelled"]').wait_for()
    assert "kept" in page.locator('.download[data-state="cancelled"] .dl-line').inner_text()


def test_a_failed_pull_shows_its_reason(page: Any, file_server: FakeHub) -> None:
    f = file_server.add("plain/broken-Q8_0.gguf", small_gguf(200_000, seed=8))
    f.behavior.get_status = 500
    status(page, DEFAULT).wait_for()
    page.fill("#pull-source", f"{file_server.url}/plain/broken-Q8_0.gguf")
    page.click("#pull-button")
    shown = """(() => { const e = document.getElementById('pull-error');
        const d = document.querySelector('.download[data-state="failed"] .dl-reason');
        return (d && d.textContent) || (e && !e.hidden && e.textContent); })()"""
    page.wait_for_function(shown, timeout=60_000)
    reason = page.evaluate(shown)
    print("failed pull reason:", reason)
    assert "500" in reason  # the status the source answered, not any "error"
    page.fill("#pull-source", f"{file_server.url}/plain/not-there.gguf")
    page.click("#pull-button")
    page.wait_for_function("(() => { const e = document.getElementById('pull-error');"
                           " return !e.hidden && e.textContent.includes('not'); })()")


@pytest.mark.parametrize("width,height", [(1280, 900), (390, 844)])
def test_no_layout_break_with_many_models_and_long_ids(browser_context: Any, server: CorralServer,
                                                       width: int, height: int) -> None:
    browser_context.add_init_script(key_script(KEY))
    page = browser_context.new_page()
    page.set_viewport_size({"width": width, "height": height})
    page.goto(server.url + "/")
    status(page, DEFAULT).wait_for()
    assert page.locator("article.model").count() >= EXTRA_MODELS
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px at {width}px"
    boxes = page.evaluate("""[...document.querySelectorAll('article.model, .panel')].map(e => {
        const r = e.getBoundingClientRect(); return [r.left, r.right]; })""")
    assert all(left >= 0 and right <= width + 0.5 for left, right in boxes)


def test_a_variant_shows_the_status_of_the_model_it_runs_on(page: Any, server: CorralServer) -> None:
    """A model created FROM the default one is its variant: while the default is loaded its
    card says so (status loaded, "variant of"), and has no Load/Unload of its own."""
    variant = "pirate-variant"
    with server.client(timeout=120) as c:
        r = c.post("/api/create", json={"model": variant, "from": DEFAULT, "system": "Arr.", "stream": False})
        assert r.status_code == 200, r.text
        try:
            assert c.post("/models/load", json={"model": DEFAULT}).status_code == 200
            page.reload()
            page.wait_for_function(f"""document.querySelector('article.model[data-model="{variant}"] .model-head .status')
                                      ?.dataset.status === 'loaded'""", timeout=120_000)
            assert f"variant of {DEFAULT}" in card(page, variant).inner_text()
            assert card(page, variant).locator("button[data-action=load], button[data-action=unload]").count() == 0
            assert card(page, DEFAULT).locator("button[data-action=unload]").count() == 1
        finally:
            c.post("/models/unload", json={"model": DEFAULT})
            c.request("DELETE", "/api/delete", json={"model": variant})
