"""The page's "Find a model" panel in Chromium against a real server whose Hub is the offline
fake (the repos of tests/store/test_hub_search.py, and the embedded model as a repo to pull):
search, open a repo with the keyboard, the fit badges say what GET /hub/fit says (which
tests/store/test_hub_search.py checks against the planner), one click pulls and the model
loads, bad input and a failing Hub are messages on the page, a phone's width in the dark.

With CORRAL_SCREENSHOTS=DIR set, the panel's screenshots for docs/guide go there
(``CORRAL_SCREENSHOTS=docs/images pytest tests/ui/test_hub_page.py``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.store.embedded import embedded_model_path
from store.fake_hub import FakeHub, RepoMeta
from store.test_hub_search import hub_files

from .browser import ARGS, chromium_path, key_script
from .server import CorralServer

pytestmark = pytest.mark.integration

KEY = "ui-hub-key-0123"
SHOTS = os.environ.get("CORRAL_SCREENSHOTS")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    tmp = tmp_path_factory.mktemp("hub-files")
    with FakeHub() as h:
        hub_files(tmp, h)
        gemma = Path(embedded_model_path())
        h.add("acme/Gemma-Coder-GGUF/gemma-3-270m-it-Q4_K_M.gguf", path=gemma,
              sha256=hashlib.sha256(gemma.read_bytes()).hexdigest())
        h.repos["acme/Gemma-Coder-GGUF"] = RepoMeta(downloads=70, likes=1, license="gemma")
        yield h


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory: pytest.TempPathFactory, hub: FakeHub) -> Iterator[CorralServer]:
    tmp = tmp_path_factory.mktemp("ui-hub-server")
    (tmp / "corral.toml").write_text("[server]\nhub_timeout_s = 3\n")
    srv = CorralServer(tmp, api_key=KEY, args=("--config", str(tmp / "corral.toml")), env={
        "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home"), "HF_TOKEN": "hf_test_token",
        "HF_HUB_DISABLE_TELEMETRY": "1"})
    yield srv
    srv.stop()


@pytest.fixture
def hub_page(playwright: Any, tmp_path: Path, hub_server: CorralServer) -> Iterator[Any]:
    ctx = playwright.chromium.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=chromium_path(), args=ARGS, headless=True,
        viewport={"width": 1366, "height": 900}, bypass_csp=True)
    ctx.set_default_timeout(30_000)
    ctx.add_init_script(key_script(KEY))
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(hub_server.url + "/")
    yield page
    ctx.close()
    assert not errors, errors


def search(page: Any, text: str) -> None:
    page.click("a[href='#hub-title']")  # reachable from the navigation
    page.fill("#hub-q", text)
    page.press("#hub-q", "Enter")


def test_search_open_a_repo_by_keyboard_and_see_the_fit(hub_page: Any, hub_server: CorralServer) -> None:
    page = hub_page
    search(page, "coder")
    hit = page.locator('.hub-hit[data-repo="acme/Tiny-Coder-GGUF"]')
    hit.wait_for()
    facts = hit.inner_text()
    assert "apache-2.0" in facts and "5.0k" in facts and "2026-11-01" in facts
    assert page.locator('.hub-hit[data-repo="acme/Vision-Coder-GGUF"] .hub-projector').is_visible()
    assert not hit.locator(".hub-projector").count()
    # the keyboard: focus the repo's button and press Enter
    hit.locator("button.hub-open").focus()
    page.keyboard.press("Enter")
    rows = page.locator("table.quants tbody tr")
    rows.first.wait_for()
    assert [r.get_attribute("data-tag") for r in rows.all()] == ["Q4_K_M", "Q6_K", "F16"]
    page.wait_for_function("document.querySelectorAll('table.quants .fit[data-verdict]').length === 3")
    with hub_server.client() as c:
        for row in rows.all():
            want = c.get("/hub/fit", params={"repo": "acme/Tiny-Coder-GGUF", "file": row.get_attribute("data-file")})
            assert want.status_code == 200, want.text
            assert row.locator(".fit").get_attribute("data-verdict") == want.json()["verdict"]
            assert row.locator(".fit-summary").inner_text() == want.json()["summary"]
    if SHOTS:
        page.evaluate("document.querySelector('header.top').style.position = 'static'")  # not over the panel
        page.locator("section[aria-labelledby=hub-title]").screenshot(path=str(Path(SHOTS) / "find-a-model.png"))


def test_split_projector_and_a_lying_header_on_the_page(hub_page: Any) -> None:
    page = hub_page
    search(page, "split")
    page.locator('.hub-hit[data-repo="acme/Big-Split-GGUF"] button').click()
    row = page.locator('table.quants tr[data-tag="Q4_K_M"]')
    row.wait_for()
    assert "split, 2 parts" in row.inner_text()
    assert "not pullable yet" in row.inner_text() and row.locator("button").count() == 0
    search(page, "vision")
    page.locator('.hub-hit[data-repo="acme/Vision-Coder-GGUF"] button').click()
    page.locator("table.quants tr").nth(1).wait_for()
    assert "mmproj-Vision-Coder-F16.gguf" in page.locator("table.quants").inner_text()
    search(page, "liar")
    page.locator('.hub-hit[data-repo="acme/Liar-Coder-GGUF"] button').click()
    bad = page.locator("table.quants .fit-error")
    bad.wait_for()
    assert "Liar-Q4_K_M.gguf" in page.locator("table.quants .fit-summary").inner_text()


def test_one_click_pulls_and_the_model_loads(hub_page: Any, hub_server: CorralServer) -> None:
    page = hub_page
    search(page, "gemma")
    page.locator('.hub-hit[data-repo="acme/Gemma-Coder-GGUF"] button').click()
    row = page.locator("table.quants tr[data-tag='Q4_K_M']")
    row.wait_for()
    row.locator("button").click()
    model = "acme/Gemma-Coder-GGUF:Q4_K_M"
    page.locator(f'.download[data-state="finished"]:has-text("{model}")').wait_for(timeout=120_000)
    card = page.locator(f'article.model[data-model="{model}"]')
    card.wait_for()
    card.locator(".card-fit .fit[data-verdict]").wait_for()  # the estimate on its card before it loads
    with hub_server.client() as c:
        fit = c.get("/models/fit", params={"model": model}).json()
    assert card.locator(".card-fit .fit").get_attribute("data-verdict") == fit["verdict"] == "host"  # no GPU here
    card.locator("button[data-action=load]").click()
    page.wait_for_function(f"document.querySelector('article.model[data-model=\"{model}\"]')"
                           ".classList.contains('st-loaded')", timeout=120_000)
    assert card.locator(".card-fit").count() == 0  # loaded: the worker's own numbers instead
    # the estimate is what the worker then did: the context a slot, weights and KV within 10%
    with hub_server.client() as c:
        [inst] = next(m for m in c.get("/models").json()["data"] if m["id"] == model)["instances"]
    assert inst["n_ctx_slot"] == fit["ctx_per_slot"]
    loaded = inst["memory"]["model_bytes"] + inst["memory"]["kv_bytes"]
    assert abs(loaded - fit["host_bytes"]) <= 0.1 * loaded, (loaded, fit)


def test_bad_input_and_a_failing_hub_are_messages(hub_page: Any, hub: FakeHub) -> None:
    page = hub_page
    page.click("a[href='#hub-title']")
    page.evaluate("document.getElementById('hub-q').value = 'x'.repeat(10000)")
    page.press("#hub-q", "Enter")
    err = page.locator("#hub-error")
    err.wait_for()
    assert "too long" in err.inner_text()
    hub.search.status = 503
    try:
        search(page, "coder")
        page.wait_for_function("document.getElementById('hub-error').textContent.includes('Search failed')")
        assert "Hub" in err.inner_text()
    finally:
        hub.search.status = None
    hub.search.released.clear()
    hub.search.delay_s = 60.0
    try:
        search(page, "coder")
        page.wait_for_function("document.getElementById('hub-error').textContent.includes('did not answer')")
    finally:
        hub.search.delay_s = 0.0
        hub.search.released.set()


def test_a_phone_in_the_dark(hub_page: Any) -> None:
    page = hub_page
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 390, "height": 844})
    search(page, "coder")
    page.locator('.hub-hit[data-repo="acme/Tiny-Coder-GGUF"] button').click()
    page.wait_for_function("document.querySelectorAll('table.quants .fit[data-verdict]').length === 3")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width  # nothing wider than the phone
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg == "rgb(18, 22, 20)", bg  # the dark palette
    if SHOTS:
        page.evaluate("document.querySelector('header.top').style.position = 'static'")  # not over the panel
        page.locator("#hub-repo").scroll_into_view_if_needed()
        page.screenshot(path=str(Path(SHOTS) / "find-a-model-phone.png"))
