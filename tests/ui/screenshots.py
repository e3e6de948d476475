"""Takes the screenshots of the page shown in README.md and docs/ (a real server, the
embedded model, a real chat answer, a download in progress from a local file server).

    PYTHONPATH=src:tests python -m ui.screenshots docs/images
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

from playwright.sync_api import sync_playwright

from store.conftest import small_gguf
from store.fake_hub import FakeHub
from ui.browser import ARGS, chromium_path
from ui.server import CorralServer


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="corral-shots-"))
    models = tmp / "models"
    models.mkdir()
    (models / "Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf").write_bytes(small_gguf(4000, seed=1))
    srv = CorralServer(tmp)
    try:
        with FakeHub() as hub, sync_playwright() as p:
            f = hub.add("plain/Llama-3.2-3B-Instruct-Q8_0.gguf", small_gguf(40_000_000, seed=2))
            f.behavior.bytes_per_s = 2_000_000
            ctx = p.chromium.launch_persistent_context(str(tmp / "profile"), executable_path=chromium_path(),
                                                       args=ARGS, headless=True, bypass_csp=True,
                                                       viewport={"width": 1366, "height": 900},
                                                       device_scale_factor=1)
            page = ctx.new_page()
            page.goto(srv.url + "/")
            page.locator('article.model[data-model="gemma-3-270m"] button[data-action=load]').click()
            page.wait_for_function("document.querySelector('article.model[data-model=\"gemma-3-270m\"]')"
                                   ".classList.contains('st-loaded')", timeout=120_000)
            # traffic for the charts: a few answers from a second client while the page chats
            with srv.client(timeout=120) as c:
                def load() -> None:
                    for _ in range(6):
                        c.post("/v1/chat/completions", json={"model": "default", "max_tokens": 120,
                               "messages": [{"role": "user", "content": "Tell me about sheep."}]})
                t = threading.Thread(target=load)
                t.start()
                page.fill("#chat-system", "You are a helpful assistant.")
                page.fill("#chat-max-tokens", "60")
                page.fill("#chat-input", "Write one sentence about corrals and sheep.")
                page.click("#chat-send")
                page.locator(".msg.assistant[data-outcome]").wait_for(timeout=120_000)
                page.fill("#pull-source", f"{hub.url}/plain/Llama-3.2-3B-Instruct-Q8_0.gguf")
                page.click("#pull-button")
                page.wait_for_function("/ETA \\d/.test((document.querySelector('.download .dl-line')"
                                       " || {}).textContent || '')", timeout=60_000)
                t.join()
            page.wait_for_timeout(2500)  # one more stats sample for the charts
            page.screenshot(path=str(out / "page-wide.png"))
            page.set_viewport_size({"width": 390, "height": 844})
            page.wait_for_timeout(300)
            page.screenshot(path=str(out / "page-phone.png"))
            ctx.close()
    finally:
        srv.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/images"))
