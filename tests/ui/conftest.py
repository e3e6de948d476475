"""Fixtures of the browser tests: one real corral server (API key on, the embedded
model, 30 extra models with long ids in its models dir), a local file server for
pulls, and Chromium through Playwright."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store.conftest import small_gguf
from store.fake_hub import FakeHub

from .browser import ARGS, chromium_path, key_script
from .server import CorralServer

KEY = "ui-test-key-0123"
EXTRA_MODELS = 30


@pytest.fixture(scope="module")
def file_server() -> Iterator[FakeHub]:
    with FakeHub() as hub:
        yield hub


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    tmp = tmp_path_factory.mktemp("ui-server")
    models = tmp / "models"
    models.mkdir()
    for i in range(EXTRA_MODELS):
        name = f"org-with-a-long-name-{i:02d}-Meta-Llama-3.1-70B-Instruct-abliterated-v2-Q4_K_M.gguf"
        (models / name).write_bytes(small_gguf(2000, seed=i))
    cfg = tmp / "corral.toml"  # pulls from the loopback file server: allowed by name
    cfg.write_text('[server]\nallow_private_pull_urls = ["127.0.0.1/32"]\n')
    srv = CorralServer(tmp, api_key=KEY, args=("-c", str(cfg)))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    chromium_path()  # a clear failure (not a skip) when chromium is missing
    with sync_playwright() as p:
        yield p


@pytest.fixture
def browser_context(playwright: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh browser (fresh --user-data-dir: empty local storage)."""
    ctx = playwright.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"), executable_path=chromium_path(), args=ARGS,
        headless=True, viewport={"width": 1280, "height": 900},
        bypass_csp=True)  # the page's CSP forbids eval, which wait_for_function(str) needs
    ctx.set_default_timeout(30_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(browser_context: Any, server: CorralServer) -> Iterator[Any]:
    """The page with the right API key already stored; page errors fail the test."""
    browser_context.add_init_script(key_script(KEY))
    pg = browser_context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server.url + "/")
    yield pg
    assert not errors, errors
