"""The page's "Keys and usage" panel in Chromium against a real server with a keys file: an
admin key lists, creates (the secret shown once) and revokes keys (refused at once), sees the
usage per key and model as a table and a chart, and who runs now; an infer key sees only its
own usage. With CORRAL_SCREENSHOTS=DIR set, the panel's screenshots go there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.config.keys_file import KeySpec, hash_secret, write_keys

from .browser import ARGS, chromium_path, key_script
from .server import CorralServer

pytestmark = pytest.mark.integration

ADMIN = "crl_admin-secret-0123456789"
INFER = "crl_infer-secret-0123456789"
SHOTS = os.environ.get("CORRAL_SCREENSHOTS")


@pytest.fixture(scope="module")
def keys_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    tmp = tmp_path_factory.mktemp("ui-keys-server")
    keys = tmp / "keys.toml"
    write_keys(keys, {"root": KeySpec(hash=hash_secret(ADMIN), prefix=ADMIN[:8], scopes=("admin",),
                                      created="2026-12-01T10:00:00Z"),
                      "bob": KeySpec(hash=hash_secret(INFER), prefix=INFER[:8], rpm=60, created="2026-12-02T10:00:00Z")})
    (tmp / "corral.toml").write_text(f'[server]\nkeys_file = "{keys}"\nstate_dir = "{tmp / "state"}"\n')
    srv = CorralServer(tmp, args=("--config", str(tmp / "corral.toml")))
    yield srv
    srv.stop()


def open_page(playwright: Any, tmp: Path, srv: CorralServer, key: str, **ctx_args: Any) -> tuple[Any, Any, list[str]]:
    ctx = playwright.chromium.launch_persistent_context(
        str(tmp / "profile"), executable_path=chromium_path(), args=ARGS, headless=True, bypass_csp=True,
        **{"viewport": {"width": 1366, "height": 900}, **ctx_args})
    ctx.set_default_timeout(30_000)
    ctx.add_init_script(key_script(key))
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: d.accept())  # the revoke confirmation
    page.goto(srv.url + "/")
    return ctx, page, errors


def test_an_admin_creates_uses_and_revokes_a_key(playwright: Any, tmp_path: Path, keys_server: CorralServer) -> None:
    ctx, page, errors = open_page(playwright, tmp_path, keys_server, ADMIN)
    page.click("a[href='#keys-title']")  # reachable from the navigation
    page.locator('table.keys-table tr[data-key="bob"]').wait_for()
    assert "rpm 60" in page.locator('tr[data-key="bob"]').inner_text()
    # create: keyboard only
    page.focus("#key-create input[name=key-name]")
    page.keyboard.type("carol")
    page.fill("#key-create input[name=key-rpm]", "100")
    page.focus("#key-create-button")
    page.keyboard.press("Enter")
    secret_box = page.locator("#key-secret-value")
    secret_box.wait_for()
    secret = secret_box.input_value()
    assert secret.startswith("crl_")
    page.locator('table.keys-table tr[data-key="carol"]').wait_for()
    carol = {"Authorization": f"Bearer {secret}"}
    r = httpx.post(keys_server.url + "/v1/chat/completions", headers=carol, timeout=120,
                   json={"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    # its usage, as a table and a chart
    page.click("#usage-refresh")
    row = page.locator('table.usage-table tr[data-key="carol"]')
    row.wait_for()
    assert row.locator('td[data-col="requests"]').inner_text() == "1"
    assert int(row.locator('td[data-col="completion_tokens"]').inner_text()) > 0
    assert page.locator("#usage-chart .bars .bar").count() == 7
    if SHOTS:
        page.evaluate("document.querySelector('header.top').style.position = 'static'")  # not over the panel
        page.locator("section[aria-labelledby=keys-title]").screenshot(path=str(Path(SHOTS) / "keys-and-usage.png"))
    # the secret is shown once: not after a reload
    page.reload()
    page.locator('table.keys-table tr[data-key="carol"]').wait_for()
    assert secret not in page.content()
    # revoked: refused at once
    page.locator('tr[data-key="carol"] button').click()
    page.locator('table.keys-table tr[data-key="carol"]').wait_for(state="detached")
    assert httpx.get(keys_server.url + "/v1/models", headers=carol).status_code == 401
    ctx.close()
    assert not errors, errors


def test_an_infer_key_sees_its_own_usage_only(playwright: Any, tmp_path: Path, keys_server: CorralServer) -> None:
    ctx, page, errors = open_page(playwright, tmp_path, keys_server, INFER, color_scheme="dark",
                                  viewport={"width": 390, "height": 844})
    page.click("a[href='#keys-title']")
    page.locator("#keys-own").wait_for()
    assert page.locator("#keys-admin").get_attribute("hidden") is not None  # the keys part is not shown
    assert page.locator("table.keys-table").count() == 0
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert httpx.get(keys_server.url + "/keys", headers={"Authorization": f"Bearer {INFER}"}).status_code == 403
    own = httpx.get(keys_server.url + "/usage", headers={"Authorization": f"Bearer {INFER}"}).json()["data"]
    assert all(r["key"] == "bob" for r in own)
    assert "carol" not in page.locator("#usage-table").inner_text()
    ctx.close()
    assert not errors, errors


def test_the_admin_panel_on_a_phone_in_the_dark(playwright: Any, tmp_path: Path, keys_server: CorralServer) -> None:
    ctx, page, errors = open_page(playwright, tmp_path, keys_server, ADMIN, color_scheme="dark",
                                  viewport={"width": 390, "height": 844})
    page.click("a[href='#keys-title']")
    page.locator('table.keys-table tr[data-key="bob"]').wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    if SHOTS:
        page.evaluate("document.querySelector('header.top').style.position = 'static'")  # not over the panel
        page.locator("section[aria-labelledby=keys-title]").screenshot(
            path=str(Path(SHOTS) / "keys-and-usage-phone.png"))
    ctx.close()
    assert not errors, errors
