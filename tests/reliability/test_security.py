"""Security: the API key, cross-site requests, DNS rebinding, and files outside the models dir.

Router side with fake workers (tests/support/fake_worker.py): what is checked here is
what the router lets through, not what a model does with it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import httpx
import pytest

from corral.api import guard
from corral.api.page.routes import is_public_path
from support.harness import Harness, chat

JSON = {"content-type": "application/json"}


def fake_gguf(harness: Harness, path: Path, **script: object) -> Path:
    """A file the fake worker reads as its script (it ignores the name)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(script))
    return path


# ------------------------------------------------------------------ API key


def all_routes(routes: list[object], prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every route, also those of included routers (schema or not)."""
    out: set[tuple[str, str]] = set()
    for r in routes:
        inner = getattr(r, "original_router", None) or getattr(r, "router", None)
        if inner is not None and not hasattr(r, "methods"):
            out |= all_routes(inner.routes, prefix + getattr(r, "prefix", ""))
            continue
        out |= {(m, prefix + r.path) for m in getattr(r, "methods", None) or () if m != "HEAD"}
    return out


async def test_every_route_but_health_needs_the_key(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a"))}}, api_key="s3cret")
    await harness.start(cfg)
    c = harness.client
    routes = sorted(all_routes(harness.app.routes))
    assert ("GET", "/docs") in routes and ("GET", "/openapi.json") in routes
    assert ("GET", "/metrics") in routes and ("GET", "/models/events") in routes
    for method, path in routes:
        url = path.replace("{model_id}", "a").replace("{pull_id}", "pull-x").replace("{path}", "x")
        r = await c.request(method, url, content=b"{}", headers=JSON)
        if path == "/health":
            assert r.status_code == 200
        elif method == "GET" and is_public_path(url):  # the web page's static files: no data in them
            assert r.status_code in (200, 404) and harness.script("a").name not in r.text
        else:
            assert r.status_code == 401, (method, path, r.status_code)
            assert "API key" in r.text  # in the shape of that route's API
            assert r.headers["www-authenticate"] == "Bearer"
    # wrong keys of every length, and schemes that are not Bearer
    for auth in ("Bearer s3cre", "Bearer s3cretX", "Bearer", "Basic s3cret", "s3cret", "Bearer S3CRET"):
        r = await c.get("/v1/models", headers={"Authorization": auth})
        assert r.status_code == 401, auth
    assert (await c.get("/v1/models", headers={"Authorization": "Bearer s3cret"})).status_code == 200
    assert (await c.get("/v1/models", headers={"Authorization": "bearer s3cret"})).status_code == 200
    assert (await c.get("/v1/models", headers={"x-api-key": "s3cret"})).status_code == 200
    assert (await c.get("/v1/models", headers={"x-api-key": "s3cre"})).status_code == 401
    async with c.stream("GET", "/models/events", headers={"Authorization": "Bearer s3cret"}) as r:
        assert r.status_code == 200


def test_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison runs on fixed-length digests with hmac.compare_digest: neither the
    content nor the length of the presented key changes what is compared."""
    seen: list[tuple[int, int]] = []
    real = guard.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    assert guard.key_matches(b"s3cret", "s3cret")
    assert not guard.key_matches(b"s", "s3cret")
    assert not guard.key_matches(b"x" * 10_000, "s3cret")
    assert seen == [(32, 32)] * 3
    assert hashlib.sha256(b"s3cret").digest_size == 32


# ------------------------------------------------------------------ cross-site requests


async def test_cross_site_requests_are_refused(harness: Harness) -> None:
    await harness.serve()
    c = harness.client
    base = harness.base_url
    # a form/text POST from a web page: no preflight in the browser, so the server refuses it
    r = await c.post("/models/load", content=b'{"model": "a"}', headers={"content-type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = await c.post("/models/load", content=b"model=a",
                     headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415
    assert harness.plane.pools["a"].status() == "unloaded"
    # any request from a foreign origin, even with a JSON body (the browser would preflight it)
    r = await c.post("/models/load", json={"model": "a"}, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert "allowed_origins" in r.json()["error"]["message"]
    r = await c.options("/models/load", headers={"Origin": "https://evil.example",
                                                  "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert harness.plane.pools["a"].status() == "unloaded"
    # the page the server itself serves (same origin) may call it
    r = await c.post("/models/load", json={"model": "a"}, headers={"Origin": base})
    assert r.status_code == 200
    # a GET never changes state: the Nitro unload GET (an <img> on any page) is refused
    r = await c.get("/inferences/llamacpp/unloadmodel", params={"model_id": "a"})
    assert r.status_code == 405 and "POST" in r.json()["error"]["message"]
    assert harness.plane.pools["a"].status() == "loaded"


async def test_allowed_origins_get_cors(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a"))}},
                         allowed_origins=["http://localhost:3000", "https://*.example.com"])
    await harness.start(cfg)
    c = harness.client
    for origin in ("http://localhost:3000", "https://app.example.com"):
        r = await c.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert r.status_code == 204
        assert r.headers["access-control-allow-origin"] == origin
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "content-type" in r.headers["access-control-allow-headers"]
        r = await c.post("/v1/chat/completions", json=chat("a"), headers={"Origin": origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    r = await c.post("/v1/chat/completions", json=chat("a"), headers={"Origin": "http://localhost:3001"})
    assert r.status_code == 403
    r = await c.get("/v1/models")  # no Origin (curl, SDKs): no CORS headers, served
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


async def test_dns_rebinding_host_check(harness: Harness) -> None:
    cfg = harness.config({"a": {"path": str(harness.script("a"))}}, allowed_hosts=["corral.lan"])
    await harness.start(cfg)
    c = harness.client
    port = harness.base_url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example"):
        r = await c.get("/v1/models", headers={"Host": host})
        assert r.status_code == 403, host
        assert r.json()["error"]["code"] == "host_not_allowed" and "allowed_hosts" in r.json()["error"]["message"]
    r = await c.post("/models/load", json={"model": "a"}, headers={"Host": "evil.example"})
    assert r.status_code == 403 and harness.plane.pools["a"].status() == "unloaded"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "corral.lan",
                 f"corral.lan:{port}", "10.1.2.3"):
        assert (await c.get("/v1/models", headers={"Host": host})).status_code == 200, host


# ------------------------------------------------------------------ files outside the models dir


async def test_nitro_cannot_probe_or_load_files_outside(harness: Harness, tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    outside = tmp_path / "outside"
    good = fake_gguf(harness, allowed / "ok.gguf")
    secret = outside / "secret.gguf"
    secret.parent.mkdir()
    secret.write_bytes(b"root:x:0:0")
    link = allowed / "link.gguf"
    link.symlink_to(secret)
    cfg = harness.config({"a": {"path": str(harness.script("a")), "aliases": ["default"]}},
                         allowed_model_dirs=[str(allowed)], models_dir=str(tmp_path / "models"))
    await harness.start(cfg, use_store=True)
    c = harness.client
    answers = []
    for path in (str(secret), str(outside / "missing.gguf"), "/etc/passwd", "/etc/nothing-here",
                 str(link), str(allowed / ".." / "outside" / "secret.gguf"), str(outside)):
        r = await c.post("/inferences/llamacpp/loadmodel", json={"model_id": "m", "llama_model_path": path})
        assert r.status_code == 403, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "path_not_allowed" and "allowed_model_dirs" in err["message"]
        answers.append(err["message"].replace(repr(path), "PATH"))
    assert len(set(answers)) == 1  # exists or not, file or dir, link or not: the same answer
    assert "m" not in harness.plane.pools
    r = await c.get("/models")
    assert str(outside) not in r.text and "root:" not in r.text
    # inside the allowed dir: loads
    r = await c.post("/inferences/llamacpp/loadmodel", json={"model_id": "m", "llama_model_path": str(good)})
    assert r.status_code == 200, r.text


async def test_nitro_cannot_take_over_an_alias(harness: Harness, tmp_path: Path) -> None:
    good = fake_gguf(harness, tmp_path / "allowed" / "ok.gguf")
    cfg = harness.config({"a": {"path": str(harness.script("a")), "aliases": ["default"]}},
                         allowed_model_dirs=[str(good.parent)])
    await harness.start(cfg)
    c = harness.client
    r = await c.post("/inferences/llamacpp/loadmodel", json={"model_id": "default", "llama_model_path": str(good)})
    assert r.status_code == 409 and r.json()["error"]["param"] == "model_id"
    assert harness.plane.catalog.resolve_id("default") == "a"
    r = await c.post("/inferences/llamacpp/loadmodel", json={"model_id": "a", "llama_model_path": str(good)})
    assert r.status_code == 409  # a config model is not replaced either


async def test_nitro_failed_load_is_a_4xx_and_leaves_nothing(harness: Harness, tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    bad = fake_gguf(harness, allowed / "bad.gguf", load_fail="bad magic b'root' in /secret/file",
                    stderr=["first caller's secret log line"])
    bad2 = fake_gguf(harness, allowed / "bad2.gguf", load_fail="unsupported thing")
    await harness.serve({}, allowed_model_dirs=[str(allowed)])
    c = harness.client
    r = await c.post("/inferences/llamacpp/loadmodel", json={"model_id": "m", "llama_model_path": str(bad)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_load_failed", r.text
    assert "m" not in harness.plane.pools  # failed entries are not kept (nor their paths listed)
    assert str(bad) not in (await c.get("/models")).text
    # the next caller of the same id sees its own failure only, not the earlier log
    r = await c.post("/inferences/llamacpp/loadmodel", json={"model_id": "m", "llama_model_path": str(bad2)})
    assert r.status_code == 400
    assert "secret" not in r.text and "unsupported thing" in r.text


async def test_symlinks_leading_out_are_not_served_and_deleting_a_link_removes_it(
        harness: Harness, tmp_path: Path) -> None:
    models = tmp_path / "models"
    outside = fake_gguf(harness, tmp_path / "outside" / "real.gguf")
    allowed_real = fake_gguf(harness, tmp_path / "shared" / "shared.gguf")
    inside = fake_gguf(harness, models / "plain.gguf")
    models.joinpath("escape.gguf").symlink_to(outside)
    models.joinpath("linked.gguf").symlink_to(allowed_real)
    cfg = harness.config({}, models_dir=str(models), allowed_model_dirs=[str(allowed_real.parent)])
    await harness.start(cfg, use_store=True)
    c = harness.client
    ids = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
    assert "escape" not in ids and {"plain", "linked"} <= set(ids)
    r = await c.post("/v1/chat/completions", json=chat("escape"))
    assert r.status_code == 404
    r = await c.delete("/models/escape")
    assert r.status_code == 404 and outside.exists()
    # a link into an allowed dir: DELETE removes the link (not its target), for good
    r = await c.delete("/models/linked")
    assert r.status_code == 200, r.text
    assert not models.joinpath("linked.gguf").is_symlink() and allowed_real.exists()
    assert (await c.post("/models/reload")).status_code == 200
    ids = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
    assert "linked" not in ids and "plain" in ids and inside.exists()


async def test_pull_targets_stay_in_the_models_dir(harness: Harness, tmp_path: Path) -> None:
    await harness.start(harness.config({}, models_dir=str(tmp_path / "models")), use_store=True)
    c = harness.client
    for mid in ("../escape", "/etc/passwd", "a/../../b", ".hidden", "x" * 100_000):
        r = await c.post("/models/pull", json={"model": "owner/repo/file.gguf", "id": mid})
        assert 400 <= r.status_code < 500 and r.status_code != 404, (mid[:20], r.text[:200])
    assert not (tmp_path / "escape.gguf").exists()


# ------------------------------------------------------------------ local exposure


async def test_logs_are_owner_only(harness: Harness, tmp_path: Path) -> None:
    logs = tmp_path / "new" / "logs"
    await harness.serve({"a": {"path": str(harness.script("a"))}}, log_dir=str(logs))
    assert (await harness.client.post("/models/load", json={"model": "a"})).status_code == 200
    assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    files = list(logs.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)


def test_api_key_help_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from corral.cli.main import app

    out = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    assert "CORRAL_API_KEY" in out and "process list" in " ".join(out.split())


def test_rm_cannot_reach_other_routes_or_ids(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from corral.cli.main import app

    models = tmp_path / "models"
    models.mkdir()
    for name in ("x", "keep", "pull"):
        (models / f"{name}.gguf").write_bytes(b"GGUF")
    env = {"CORRAL_SERVER": "http://127.0.0.1:9", "CORRAL_MODELS_DIR": str(models)}
    for mid in ("x#y", "keep?force=true", "x/../keep", "%78"):
        res = CliRunner().invoke(app, ["rm", mid], env=env)
        assert res.exit_code == 1 and "invalid model id" in res.output, (mid, res.output)
    assert sorted(p.name for p in models.iterdir()) == ["keep.gguf", "pull.gguf", "x.gguf"]


async def test_a_model_id_never_reaches_the_pull_routes(harness: Harness, tmp_path: Path) -> None:
    """`corral rm pull/x` quotes the id whole (pull%2Fx); the server must then treat it as a
    model id, not as DELETE /models/pull/{pull_id} (Starlette matches the decoded path)."""
    from corral.cli.client import model_path

    await harness.start(harness.config({}, models_dir=str(tmp_path / "models")), use_store=True)
    url = model_path("/models", "pull/pull-123")
    assert url == "/models/pull%2Fpull-123"
    r = await harness.client.delete(url)
    assert r.status_code == 404 and "not in the store" in r.text and "no pull" not in r.text
    r = await harness.client.delete("/models/pull/pull-123")  # the real route still works
    assert r.status_code == 404 and "no pull with id" in r.text


async def test_partial_downloads_are_owner_only(hub, store, bus) -> None:  # noqa: ANN001
    from corral.store.downloads import DownloadManager
    from store.conftest import small_gguf

    f = hub.add("owner/repo/slow.gguf", small_gguf(2_000_000))
    f.behavior.bytes_per_s = 200_000
    dm = DownloadManager(store, bus)
    try:
        h = await dm.start("owner/repo/slow.gguf")
        assert h.partial_path is not None
        part = h.partial_path
        assert stat.S_IMODE(part.stat().st_mode) == 0o600
        assert stat.S_IMODE(part.parent.stat().st_mode) == 0o700
        others = [p for p in part.parent.iterdir()]
        assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in others), others
        await dm.cancel(h.pull_id)
    finally:
        await dm.close()
    assert os.environ.get("HF_ENDPOINT") == hub.url
    assert httpx.URL(hub.url).host == "127.0.0.1"
