"""Search the Hub and fit before download (api/page/hub.py), through a real `corral serve`
whose Hub is the offline fake (tests/store/fake_hub.py) and whose devices are the GPU
tests' fake ones (CORRAL_FAKE_DEVICES): a GPU of 600 MiB free, a host of 1 GiB.

The fit estimates are checked against ``corral.fit.estimate`` on the same files read
locally: the header read with range requests gives the planner what the file gives it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.fit.estimate import GpuBudget, estimate
from corral.fit.layout import read_layout
from corral.model.settings import ModelSettings
from corral.store.remote_header import FIRST_READ, MAX_HEADER_BYTES
from testkit.gguf_hub import lying_header, write_llama_shaped
from ui.server import CorralServer

from .fake_hub import FakeHub, RepoMeta

MiB = 1024 * 1024
FAKE_DEVICES = json.dumps([
    {"name": "FakeGPU0", "backend": "CUDA", "kind": "gpu", "free_bytes": 600 * MiB, "total_bytes": 1024 * MiB},
    {"name": "CPU", "backend": "CPU", "kind": "cpu", "free_bytes": 1024 * MiB, "total_bytes": 2048 * MiB}])
# the quantizations of acme/Tiny-Coder-GGUF: (tag, bytes of each of its 8 layers)
TINY = [("Q4_K_M", 256 * 1024), ("Q6_K", 16 * MiB), ("F16", 256 * MiB)]


def hub_files(tmp: Path, hub: FakeHub) -> dict[str, Path]:
    made: dict[str, Path] = {}

    def add(key: str, path: Path) -> None:
        import hashlib

        hub.add(key, path=path, sha256=hashlib.sha256(key.encode()).hexdigest())
        made[key] = path

    for tag, layer in TINY:
        add(f"acme/Tiny-Coder-GGUF/Tiny-Coder-{tag}.gguf",
            write_llama_shaped(tmp / f"Tiny-Coder-{tag}.gguf", layer_bytes=layer))
    hub.repos["acme/Tiny-Coder-GGUF"] = RepoMeta(downloads=5000, likes=42, license="apache-2.0")
    for k in (1, 2):
        name = f"Big-Q4_K_M-{k:05d}-of-00002.gguf"
        add(f"acme/Big-Split-GGUF/{name}", write_llama_shaped(tmp / name, layer_bytes=MiB, split=(k, 2)))
    hub.repos["acme/Big-Split-GGUF"] = RepoMeta(downloads=300, likes=3, license="mit")
    add("acme/Vision-Coder-GGUF/Vision-Coder-Q4_K_M.gguf", write_llama_shaped(tmp / "Vision-Q4_K_M.gguf"))
    add("acme/Vision-Coder-GGUF/mmproj-Vision-Coder-F16.gguf", write_llama_shaped(tmp / "mmproj.gguf", n_layer=2))
    hub.repos["acme/Vision-Coder-GGUF"] = RepoMeta(downloads=900, likes=9)
    add("acme/Many-Files-Coder-GGUF/Many-Q4_K_M.gguf", write_llama_shaped(tmp / "Many-Q4_K_M.gguf"))
    for i in range(499):
        hub.add(f"acme/Many-Files-Coder-GGUF/notes/n{i:03d}.txt", b"x")
    add("acme/Liar-Coder-GGUF/Liar-Q4_K_M.gguf", lying_header(tmp / "Liar-Q4_K_M.gguf", size=40 * MiB))
    return made


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeHub, dict[str, Path]]]:
    tmp = tmp_path_factory.mktemp("hub-files")
    with FakeHub() as hub:
        yield hub, hub_files(tmp, hub)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fake_hub: tuple[FakeHub, dict[str, Path]]
           ) -> Iterator[CorralServer]:
    hub, _ = fake_hub
    tmp = tmp_path_factory.mktemp("hub-server")
    (tmp / "corral.toml").write_text("[server]\nhub_timeout_s = 3\n")
    srv = CorralServer(tmp, args=("--config", str(tmp / "corral.toml")), env={
        "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home"), "HF_TOKEN": "hf_test_token",
        "HF_HUB_DISABLE_TELEMETRY": "1", "CORRAL_FAKE_DEVICES": FAKE_DEVICES})
    yield srv
    srv.stop()


@pytest.fixture
def client(server: CorralServer) -> Iterator[httpx.Client]:
    with server.client(timeout=60) as c:
        yield c


def test_search_lists_gguf_repos_with_their_facts(client: httpx.Client) -> None:
    r = client.get("/hub/search", params={"q": "coder"})
    assert r.status_code == 200, r.text
    hits = {h["id"]: h for h in r.json()["data"]}
    assert set(hits) == {"acme/Tiny-Coder-GGUF", "acme/Vision-Coder-GGUF", "acme/Many-Files-Coder-GGUF",
                         "acme/Liar-Coder-GGUF"}
    tiny = hits["acme/Tiny-Coder-GGUF"]
    assert (tiny["downloads"], tiny["likes"], tiny["license"]) == (5000, 42, "apache-2.0")
    assert tiny["updated"].startswith("2026-11-01") and tiny["gguf_files"] == 3 and not tiny["projector"]
    assert hits["acme/Vision-Coder-GGUF"]["projector"]
    assert [h["id"] for h in r.json()["data"]][0] == "acme/Tiny-Coder-GGUF"  # most downloaded first
    # several words: each in the name, in any order (the Hub matches the text as one piece)
    words = client.get("/hub/search", params={"q": "coder tiny"}).json()["data"]
    assert [h["id"] for h in words] == ["acme/Tiny-Coder-GGUF"]


def test_the_hub_is_asked_with_the_servers_token(client: httpx.Client, fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    hub, _ = fake_hub
    assert client.get("/hub/search", params={"q": "tiny"}).status_code == 200
    assert client.get("/hub/fit", params={"repo": "acme/Vision-Coder-GGUF", "file": "Vision-Coder-Q4_K_M.gguf"}) \
        .status_code == 200
    asked = [q for q in hub.requests if q.path == "/api/models" or q.path.endswith("/Vision-Coder-Q4_K_M.gguf")]
    assert asked and all(q.auth == "Bearer hf_test_token" for q in asked), asked


def test_repo_lists_quantizations_single_split_and_projector(client: httpx.Client,
                                                             fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    _, files = fake_hub
    r = client.get("/hub/repo", params={"repo": "acme/Tiny-Coder-GGUF"})
    assert r.status_code == 200, r.text
    quants = {q["tag"]: q for q in r.json()["quants"]}
    assert set(quants) == {"Q4_K_M", "Q6_K", "F16"}
    for tag, q in quants.items():
        path = files[f"acme/Tiny-Coder-GGUF/Tiny-Coder-{tag}.gguf"]
        assert q["size"] == path.stat().st_size and not q["split"]
        assert q["source"] == f"acme/Tiny-Coder-GGUF:{tag}"
    split = client.get("/hub/repo", params={"repo": "acme/Big-Split-GGUF"}).json()["quants"]
    assert len(split) == 1 and split[0]["split"] and len(split[0]["files"]) == 2
    assert split[0]["source"] == ""  # not pullable yet (a pull would bring its first part only)
    assert split[0]["size"] == sum(p.stat().st_size for k, p in files.items() if k.startswith("acme/Big-Split"))
    vision = client.get("/hub/repo", params={"repo": "acme/Vision-Coder-GGUF"}).json()
    assert [q["tag"] for q in vision["quants"]] == ["Q4_K_M"]  # the projector is not a quantization
    assert vision["quants"][0]["projector"] == "mmproj-Vision-Coder-F16.gguf"
    assert vision["quants"][0]["projector_size"] == files["acme/Vision-Coder-GGUF/mmproj-Vision-Coder-F16.gguf"].stat().st_size


def _expected(path: Path | list[Path], body: dict[str, Any]) -> dict[str, Any]:
    """``estimate`` on the local file, with the settings a pulled model gets here and the
    devices the route reports."""
    from corral.fit.layout import layout_of
    from corral.model.gguf_header import read_header

    paths = path if isinstance(path, list) else [path]
    layout = layout_of(*[read_header(p) for p in paths]) if len(paths) > 1 else read_layout(paths[0])
    settings = ModelSettings(ctx_len=2048, n_parallel=2)  # the server's --ctx-len and --n-parallel
    est = estimate(layout, settings, gpus=[GpuBudget(g["name"], g["budget_bytes"]) for g in body["gpus"]],
                   host_available_bytes=body["host_available_bytes"])
    return est.to_dict()


def test_fit_matches_the_planner_and_reads_only_the_header(client: httpx.Client,
                                                           fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    hub, files = fake_hub
    verdicts = {}
    for tag, _ in TINY:
        key = f"acme/Tiny-Coder-GGUF/Tiny-Coder-{tag}.gguf"
        r = client.get("/hub/fit", params={"repo": "acme/Tiny-Coder-GGUF", "file": f"Tiny-Coder-{tag}.gguf"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["gpus"] == [{"name": "FakeGPU0", "budget_bytes": 600 * MiB - 512 * MiB}]
        assert body["host_available_bytes"] == 1024 * MiB
        want = _expected(files[key], body)
        assert {k: body[k] for k in want} == want
        verdicts[tag] = body["verdict"]
        served = hub.bytes_served.get(key, 0)
        assert 0 < served <= FIRST_READ < files[key].stat().st_size // 4, (key, served)
    assert verdicts == {"Q4_K_M": "gpu", "Q6_K": "partial", "F16": "none"}
    # asked again: the cached header, not a byte more
    before = dict(hub.bytes_served)
    assert client.get("/hub/fit", params={"repo": "acme/Tiny-Coder-GGUF", "file": "Tiny-Coder-F16.gguf"}).json() \
        ["verdict"] == "none"
    assert hub.bytes_served == before


def test_fit_of_a_split_model_reads_every_part(client: httpx.Client,
                                               fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    _, files = fake_hub
    r = client.get("/hub/fit", params={"repo": "acme/Big-Split-GGUF", "file": "Big-Q4_K_M-00001-of-00002.gguf"})
    assert r.status_code == 200, r.text
    parts = [files[f"acme/Big-Split-GGUF/Big-Q4_K_M-{k:05d}-of-00002.gguf"] for k in (1, 2)]
    want = _expected(parts, r.json())
    assert {k: r.json()[k] for k in want} == want


def test_fit_with_the_projector_a_pull_brings(client: httpx.Client, fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    _, files = fake_hub
    proj = files["acme/Vision-Coder-GGUF/mmproj-Vision-Coder-F16.gguf"]
    plain = client.get("/hub/fit", params={"repo": "acme/Vision-Coder-GGUF", "file": "Vision-Coder-Q4_K_M.gguf"}).json()
    r = client.get("/hub/fit", params={"repo": "acme/Vision-Coder-GGUF", "file": "Vision-Coder-Q4_K_M.gguf",
                                       "projector": "mmproj-Vision-Coder-F16.gguf"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["gpus"] == [{"name": "FakeGPU0", "budget_bytes": 88 * MiB - proj.stat().st_size}]  # it sits there
    layout = read_layout(files["acme/Vision-Coder-GGUF/Vision-Coder-Q4_K_M.gguf"])
    want = estimate(layout, ModelSettings(ctx_len=2048, n_parallel=2, mmproj="mmproj-Vision-Coder-F16.gguf"),
                    gpus=[GpuBudget("FakeGPU0", 88 * MiB - proj.stat().st_size)],
                    host_available_bytes=body["host_available_bytes"]).to_dict()
    assert {k: body[k] for k in want} == want
    assert body["gpu_bytes"] > plain["gpu_bytes"]  # the side context's room
    bad = client.get("/hub/fit", params={"repo": "acme/Vision-Coder-GGUF", "file": "Vision-Coder-Q4_K_M.gguf",
                                         "projector": "../x.gguf"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "projector"


def test_a_header_that_lies_is_a_clear_400_after_a_bounded_read(client: httpx.Client,
                                                                fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    hub, _ = fake_hub
    r = client.get("/hub/fit", params={"repo": "acme/Liar-Coder-GGUF", "file": "Liar-Q4_K_M.gguf"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unreadable_model"
    assert "Liar-Q4_K_M.gguf" in r.json()["error"]["message"]
    assert hub.bytes_served["acme/Liar-Coder-GGUF/Liar-Q4_K_M.gguf"] <= MAX_HEADER_BYTES
    # asked again: refused from memory, not read again
    before = hub.bytes_served["acme/Liar-Coder-GGUF/Liar-Q4_K_M.gguf"]
    again = client.get("/hub/fit", params={"repo": "acme/Liar-Coder-GGUF", "file": "Liar-Q4_K_M.gguf"})
    assert again.status_code == 400 and again.json()["error"]["message"] == r.json()["error"]["message"]
    assert hub.bytes_served["acme/Liar-Coder-GGUF/Liar-Q4_K_M.gguf"] == before


def test_bad_input_is_a_clear_4xx(client: httpx.Client) -> None:
    r = client.get("/hub/search", params={"q": "x" * 10_000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "q"
    assert client.get("/hub/search", params={"q": "  "}).status_code == 400
    for repo in ("no-slash", "../../etc", "a/b/c", "x" * 300 + "/y"):
        r = client.get("/hub/repo", params={"repo": repo})
        assert r.status_code == 400, (repo, r.text)
    for file in ("../x.gguf", "a.bin", "/abs.gguf", "m-00001-of-99999.gguf"):
        r = client.get("/hub/fit", params={"repo": "acme/Tiny-Coder-GGUF", "file": file})
        assert r.status_code == 400, (file, r.text)
    assert client.get("/hub/repo", params={"repo": "acme/Nothing-Here"}).status_code == 404


def test_a_repo_of_500_files_lists_its_one_quantization(client: httpx.Client) -> None:
    r = client.get("/hub/repo", params={"repo": "acme/Many-Files-Coder-GGUF"})
    assert r.status_code == 200, r.text
    assert r.json()["files"] == 500 and not r.json()["truncated"]
    assert [q["tag"] for q in r.json()["quants"]] == ["Q4_K_M"]


def test_a_hub_that_is_down_or_slow_is_a_503(client: httpx.Client, fake_hub: tuple[FakeHub, dict[str, Path]]) -> None:
    hub, _ = fake_hub
    hub.search.status = 500
    try:
        r = client.get("/hub/search", params={"q": "coder"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "hub_unreachable", r.text
    finally:
        hub.search.status = None
    # a header read the Hub fails: 503 too (the file is not at fault), nothing cached
    f = hub.files["acme/Many-Files-Coder-GGUF/Many-Q4_K_M.gguf"]
    f.behavior.get_status = 500
    try:
        r = client.get("/hub/fit", params={"repo": "acme/Many-Files-Coder-GGUF", "file": "Many-Q4_K_M.gguf"})
        assert r.status_code == 503 and "HTTP 500" in r.json()["error"]["message"], r.text
    finally:
        f.behavior.get_status = None
    r = client.get("/hub/fit", params={"repo": "acme/Many-Files-Coder-GGUF", "file": "Many-Q4_K_M.gguf"})
    assert r.status_code == 200, r.text
    hub.search.released.clear()
    hub.search.delay_s = 60.0  # longer than the server's hub_timeout_s (3 s)
    try:
        r = client.get("/hub/search", params={"q": "coder"})
        assert r.status_code == 503 and "did not answer within 3 s" in r.json()["error"]["message"], r.text
        assert client.get("/health").status_code == 200  # the router still answers
        # the hung search still holds its thread: at most HUB_CALLS (4) wait on the Hub, the
        # others are refused at once, so a Hub that hangs cannot pile up threads
        from concurrent.futures import ThreadPoolExecutor

        from corral.api.page.hub import HUB_CALLS

        before = sum(1 for q in hub.requests if q.path == "/api/models")
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.get("/hub/search", params={"q": "coder"}), range(8)))
        assert all(a.status_code == 503 for a in answers)
        waiting = [a for a in answers if "still waiting" in a.json()["error"]["message"]]
        assert len(waiting) >= 8 - (HUB_CALLS - 1), [a.json()["error"]["message"] for a in answers]
        assert sum(1 for q in hub.requests if q.path == "/api/models") - before <= HUB_CALLS - 1
    finally:
        hub.search.delay_s = 0.0
        hub.search.released.set()



def test_corral_search_on_the_command_line(server: CorralServer) -> None:
    import subprocess
    import sys

    from ui.server import clean_env

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "corral.cli.main", "search", *args, "--host", server.url],
                              capture_output=True, text=True, env=clean_env(COLUMNS="200"), timeout=120)

    found = run("tiny-coder")
    assert found.returncode == 0, found.stderr
    assert "acme/Tiny-Coder-GGUF" in found.stdout and "apache-2.0" in found.stdout
    repo = run("--repo", "acme/Tiny-Coder-GGUF", "--json")
    assert repo.returncode == 0, repo.stderr
    verdicts = {q["tag"]: q["fit"]["verdict"] for q in json.loads(repo.stdout)["quants"]}
    assert verdicts == {"Q4_K_M": "gpu", "Q6_K": "partial", "F16": "none"}
    long = run("x" * 10_000)
    assert long.returncode == 1 and "1 to 200 characters" in long.stderr and "Traceback" not in long.stderr


def test_the_header_cache_on_disk_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from corral.store import remote_header

    monkeypatch.setattr(remote_header, "HEADER_CACHE_FILES", 5)
    monkeypatch.setattr(remote_header, "HEADER_CACHE_BYTES", 10_000)
    cache = remote_header.RemoteHeaders(tmp_path)
    for i in range(8):
        (tmp_path / f"h{i}.head").write_bytes(b"x" * 3000)
        (tmp_path / f"h{i}.size").write_text("3000")
        os.utime(tmp_path / f"h{i}.head", ns=(i * 10**9, i * 10**9))
    cache._trim()
    kept = sorted(p.name for p in tmp_path.glob("*.head"))
    assert kept == ["h5.head", "h6.head", "h7.head"]  # the newest, within 10,000 bytes
    assert sorted(p.name for p in tmp_path.glob("*.size")) == ["h5.size", "h6.size", "h7.size"]
