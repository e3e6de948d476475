"""Pull URLs as an attacker writes them (issue 45): the address policy of image URLs
(corral.store.address_policy, ``allow_private_pull_urls`` off by default) in the download
child, every spelling of a loopback address and every redirect refused with 0 hits on the
loopback listeners, the connection pinned to the checked address (no DNS rebinding), an
allowed network let through; a URL's password shown nowhere and sent to no other host.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.errors import DownloadNetworkError, InvalidRequest, PullUrlNotAllowed
from corral.events import EventBus
from corral.store.downloads import DownloadManager
from corral.store.local import ModelStore
from store.conftest import small_gguf

BODY = small_gguf(20_000)


class Listener:
    """A loopback HTTP server that counts every request and can redirect."""

    def __init__(self, host: str) -> None:
        self.hits: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers)
        self.redirects: dict[str, str] = {}
        me = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: bool) -> None:
                me.hits.append((self.command, self.path, dict(self.headers)))
                if self.path in me.redirects:
                    self.send_response(302)
                    self.send_header("Location", me.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if not self.path.endswith(".gguf") or "missing" in self.path:
                    self.send_error(404)
                    return
                if "broken" in self.path and body:  # HEAD answers, every GET fails: the pull fails mid-way
                    self.send_error(500)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                if body:
                    self.wfile.write(BODY)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._answer(True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._answer(False)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    a, b = Listener("127.0.0.1"), Listener("127.0.0.2")  # two loopback hosts: two origins
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.fixture
async def managers(tmp_path: Path) -> Any:
    made: list[DownloadManager] = []

    def make(**kw: Any) -> tuple[DownloadManager, ModelStore, EventBus]:
        root = tmp_path / f"models{len(made)}"
        root.mkdir()
        store, bus = ModelStore(root), EventBus()
        dm = DownloadManager(store, bus, retries=1, retry_backoff_s=0.01, **kw)
        made.append(dm)
        return dm, store, bus

    yield make
    for dm in made:
        await dm.close()


def spellings(port: int) -> list[str]:
    """127.0.0.1 (and the host's every address) as a URL can spell it."""
    hosts = ["127.0.0.1", "localhost", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.0.0.1", "127.1",
             "127.0.1", "0", "0.0.0.0", "[::1]", "[::]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
             "[0:0:0:0:0:ffff:127.0.0.1]", "[::127.0.0.1]", "[64:ff9b::127.0.0.1]", "localhost.", "127.0.0.1.nip.io"]
    return [f"http://{h}:{port}/m.gguf" for h in hosts]


async def test_no_spelling_of_loopback_is_pulled_by_default(listeners: Any, managers: Any) -> None:
    a, _ = listeners
    dm, store, _ = managers()
    refused = 0
    for url in spellings(a.port) + [f"http://user:pw@127.0.0.1:{a.port}/m.gguf"]:
        try:
            await dm.start(url)
        except PullUrlNotAllowed as exc:
            assert "allow_private_pull_urls" in exc.message
            refused += 1
        except InvalidRequest as exc:  # a spelling httpx refuses to parse (0177.0.0.1): never connected
            assert "not a valid URL" in exc.message, (url, exc)
        except DownloadNetworkError as exc:  # a name this machine does not resolve (localhost., nip.io offline)
            assert "cannot resolve" in exc.message, (url, exc)
        else:
            raise AssertionError(f"{url} was pulled")
    assert a.hits == []
    assert refused >= 14  # each spelling that reaches an address was judged by the policy
    assert store.list() == []


async def test_every_redirect_is_checked(listeners: Any, managers: Any) -> None:
    a, b = listeners
    # a's network is allowed; each redirect leads to b (127.0.0.2), which is not
    targets = [f"http://127.0.0.2:{b.port}/m.gguf", f"http://0x7f000002:{b.port}/m.gguf",
               f"http://[::ffff:127.0.0.2]:{b.port}/m.gguf", f"http://2130706434:{b.port}/m.gguf"]
    for i, t in enumerate(targets):
        a.redirects[f"/r{i}/m.gguf"] = t
    a.redirects["/chain/m.gguf"] = "/r0/m.gguf"  # a relative hop first, then off to b
    dm, store, _ = managers(allow_private=lambda: ["127.0.0.1/32"])
    for path in [f"/r{i}/m.gguf" for i in range(len(targets))] + ["/chain/m.gguf"]:
        with pytest.raises(PullUrlNotAllowed):
            await dm.start(f"http://127.0.0.1:{a.port}{path}")
    assert b.hits == [] and len(a.hits) >= len(targets) + 1
    assert store.list() == []


async def test_an_allowed_network_is_let_through(listeners: Any, managers: Any) -> None:
    a, b = listeners
    a.redirects["/moved/m.gguf"] = f"http://127.0.0.2:{b.port}/there/m.gguf"
    dm, store, _ = managers(allow_private=lambda: ["127.0.0.0/30"])
    h = await dm.start(f"http://127.0.0.1:{a.port}/moved/m.gguf", model_id="moved")
    assert await h.wait() == "finished", h.reason
    assert [p for _, p, _ in b.hits] == ["/there/m.gguf"] * len(b.hits) and b.hits
    m = store.get("moved")
    assert m is not None and m.path.read_bytes() == BODY
    dm2, store2, _ = managers(allow_private=lambda: True)
    h = await dm2.start(f"http://127.0.0.1:{a.port}/plain/m.gguf")
    assert await h.wait() == "finished", h.reason


def test_the_connection_goes_to_the_checked_address(listeners: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host is resolved once per hop, the answer checked and connected to: a resolver that
    answers a public address for the check and loopback for the connection (DNS rebinding)
    has no second question to answer."""
    import ipaddress

    from corral.store import fetch_http

    a, _ = listeners
    answers: list[str] = []

    def rebinding(host: str, port: int) -> list[Any]:
        answers.append(host)
        return [ipaddress.ip_address("127.0.0.1" if len(answers) == 1 else "8.8.8.8")]

    monkeypatch.setattr(fetch_http, "resolve_addresses", rebinding)
    with httpx.Client(trust_env=False, timeout=10) as c, \
            fetch_http.open_url(c, "GET", f"http://rebind.invalid:{a.port}/m.gguf", {},
                                [ipaddress.ip_network("127.0.0.1/32")]) as r:
        assert r.status_code == 200 and r.read() == BODY
    assert answers == ["rebind.invalid"]  # one question, and the connection went to its answer
    assert a.hits[0][2]["Host"] == f"rebind.invalid:{a.port}"  # the URL's host kept as Host
    monkeypatch.setattr(fetch_http, "resolve_addresses", lambda host, port: [ipaddress.ip_address("10.0.0.1")])
    from corral.store.fetch_errors import Fail

    with pytest.raises(Fail) as exc, httpx.Client(trust_env=False, timeout=10) as c, \
            fetch_http.open_url(c, "GET", f"http://rebind.invalid:{a.port}/m.gguf", {}, False):
        pass
    assert exc.value.kind == "forbidden" and len(a.hits) == 1


def _files_under(root: Path) -> dict[Path, str]:
    return {p: p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and p.suffix != ".gguf"}


async def test_a_urls_password_is_shown_nowhere_and_sent_to_no_other_host(
        listeners: Any, managers: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from corral.store import downloads

    a, b = listeners
    argv: list[str] = []  # every local user reads /proc/PID/cmdline: the request goes on stdin
    spawn = asyncio.create_subprocess_exec

    async def recording(*args: Any, **kw: Any) -> Any:
        argv.extend(str(x) for x in args)
        return await spawn(*args, **kw)

    monkeypatch.setattr(downloads.asyncio, "create_subprocess_exec", recording)
    secret = "s3cret-pw"
    a.redirects["/away/m.gguf"] = f"http://127.0.0.2:{b.port}/m.gguf"
    dm, store, bus = managers(allow_private=lambda: ["127.0.0.0/30"])
    caplog.set_level("DEBUG")
    async with bus.subscribe() as q:
        h = await dm.start(f"http://alice:{secret}@127.0.0.1:{a.port}/away/m.gguf", model_id="away")
        shown = [json.dumps(h.progress())]
        assert await h.wait() == "finished", h.reason
        failed = None
        try:
            await dm.start(f"http://alice:{secret}@127.0.0.1:{a.port}/missing.gguf")
        except Exception as exc:  # noqa: BLE001 - a 404: its reason names the URL
            failed = str(exc)
        assert failed is not None and "missing.gguf" in failed
        broken = await dm.start(f"http://alice:{secret}@127.0.0.1:{a.port}/broken.gguf")  # its partial note stays
        assert await broken.wait() == "failed"
        shown.append(json.dumps(broken.progress()) + (broken.reason or ""))
        events = []
        while not q.empty():
            events.append(q.get_nowait())
    shown += [json.dumps(e) for e in events] + [json.dumps(h.progress()), failed, caplog.text]
    shown += [json.dumps(m.to_dict()) for m in store.list()] + [" ".join(argv)]
    files = _files_under(store.root)
    shown += list(files.values())
    assert all(secret not in s for s in shown), [s for s in shown if secret in s][:1]
    assert any("***@127.0.0.1" in s for s in shown)  # redacted, not dropped
    manifest = store.manifest_path("away")
    assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o600
    # the origin got the credentials (Basic), the host it redirected to did not
    basic = "Basic " + base64.b64encode(f"alice:{secret}".encode()).decode()
    assert any(hd.get("Authorization") == basic for _, _, hd in a.hits)
    assert b.hits and all("Authorization" not in hd for _, _, hd in b.hits)


async def test_through_the_api_the_setting_decides_and_no_answer_shows_the_password(
        listeners: Any, tmp_path: Path) -> None:
    from support.harness import Harness

    a, _ = listeners
    url = f"http://bob:pa55word@127.0.0.1:{a.port}/api-m.gguf"
    for allowed in (False, ["127.0.0.1/32"]):
        h = Harness(tmp_path / str(bool(allowed)))
        h.tmp.mkdir()
        (h.tmp / "models").mkdir()
        try:
            await h.start(h.config({}, models_dir=str(h.tmp / "models"), allow_private_pull_urls=allowed),
                          use_store=True)
            assert h.client is not None
            r = await h.client.post("/models/pull", json={"model": url})
            if not allowed:
                assert r.status_code == 403, r.text
                err = r.json()["error"]
                assert err["code"] == "pull_url_not_allowed" and "allow_private_pull_urls" in err["message"]
                assert "pa55word" not in r.text and a.hits == []
                continue
            assert r.status_code == 202, r.text
            pull = r.json()["id"]
            await h.app.state.downloads.get(pull).wait()
            status = await h.client.get(f"/models/pull/{pull}")
            models = await h.client.get("/models")
            assert status.json()["status"] == "finished"
            for text in (r.text, status.text, models.text):
                assert "pa55word" not in text
            assert "***@127.0.0.1" in status.text and a.hits
        finally:
            await h.stop()
