"""Open WebUI (PyPI ``open-webui`` 0.12.4) against corral: its recorded requests
(tests/fixtures/clients/open_webui/recorded_raw/, recorded by capture_proxy.py there, both
connections: OpenAI's ``/v1`` and Ollama's) replayed against a real router, real workers and
the embedded model.

Changes to what was recorded: the model's config sets ``default_max_tokens`` (the follow-up
tasks send no limit; a user serving a front end sets one), and the one "held back" check adds
a ``logit_bias`` to the recorded chat so the model's answer starts with ``[``. The model
runs with a slot that holds Open WebUI's 36 tool definitions (6.4k tokens) and ``swa_full``, so
its chats share that prefix.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.harness import Harness, _until

from store.conftest import small_gguf
from store.fake_hub import FakeHub

pytestmark = pytest.mark.integration

RAW = Path(__file__).parent.parent / "fixtures" / "clients" / "open_webui" / "recorded_raw"
MODEL = "gemma-3-270m"  # the model's id when the requests were recorded
PULLED = "owner/tiny-GGUF:Q8_0"
_DROP = {"host", "content-length", "connection", "accept-encoding", "authorization"}


def recorded(n: int) -> dict[str, Any]:
    """One capture: method, path, query, headers (hop-by-hop and the redacted key left out), body."""
    r: dict[str, Any] = json.loads((RAW / f"{n:03d}.json").read_text())
    r["headers"] = {k: v for k, v in r["headers"].items() if k.lower() not in _DROP}
    return r


async def replay(c: httpx.AsyncClient, n: int, body: dict[str, Any] | None = None) -> httpx.Response:
    r = recorded(n)
    sent = r["body"] if body is None else body
    return await c.request(r["method"], r["path"], headers=r["headers"],
                           content=None if sent is None else json.dumps(sent), timeout=900)


def _config(harness: Harness, model_path: Path, **server: Any) -> Any:
    return harness.config({MODEL: {"path": str(model_path), "ctx_len": 16384, "n_parallel": 1, "threads": 2,
                                   "swa_full": True, "default_max_tokens": 8}},
                          worker_command=None, queue_timeout_s=900.0, load_timeout_s=120.0, **server)


async def test_the_model_lists_of_both_connections_a_pull_with_progress_and_a_delete(
        harness: Harness, model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's loads (001-011) as Open WebUI reads them; its admin pull (016: progress
    lines, then the model in both lists) and delete (020: gone from both)."""
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        data = small_gguf(3_000_000)
        hub.add("owner/tiny-GGUF/tiny-Q8_0.gguf", data)
        hub.files["owner/tiny-GGUF/tiny-Q8_0.gguf"].behavior.bytes_per_s = 6_000_000
        await harness.start(_config(harness, model_path, models_dir=str(tmp_path / "models")), use_store=True)
        c = harness.client

        async def lists() -> tuple[list[str], list[str]]:
            answers = {}
            for n in range(1, 12):
                r = await replay(c, n)
                assert r.status_code == 200, (n, r.text)
                answers[recorded(n)["path"]] = r.json()
            assert answers["/api/version"]["version"]  # Open WebUI shows the Ollama version
            assert isinstance(answers["/api/ps"]["models"], list)
            tags = answers["/api/tags"]["models"]
            assert all(t["name"] == t["model"] and t["details"] is not None for t in tags)
            return [m["id"] for m in answers["/v1/models"]["data"]], [t["name"] for t in tags]

        openai_ids, ollama_names = await lists()
        assert MODEL in openai_ids and MODEL in ollama_names and PULLED not in ollama_names

        r = await replay(c, 16)  # {"name", "model", "insecure": true}, read as a stream
        assert r.status_code == 200, r.text
        lines = [json.loads(line) for line in r.text.splitlines() if line]
        assert lines[0]["status"] == "pulling manifest" and lines[-1]["status"] == "success"
        progress = [p for p in lines if p.get("digest")]
        assert progress and progress[-1]["completed"] == progress[-1]["total"] == len(data)
        assert all(a["completed"] <= b["completed"] for a, b in zip(progress, progress[1:]))
        openai_ids, ollama_names = await lists()
        assert PULLED in openai_ids and PULLED in ollama_names

        r = await replay(c, 20)
        assert r.status_code == 200, r.text
        openai_ids, ollama_names = await lists()
        assert PULLED not in openai_ids and PULLED not in ollama_names
        assert (await replay(c, 20)).status_code == 404  # a second delete: Open WebUI shows the error


async def _sse_content(c: httpx.AsyncClient, body: dict[str, Any]) -> tuple[list[str], str | None]:
    """The content of each streamed chunk that has some, and the finish reason."""
    r = recorded(13)
    pieces: list[str] = []
    finish = None
    async with c.stream("POST", r["path"], headers=r["headers"], content=json.dumps(body), timeout=900) as resp:
        assert resp.status_code == 200, await resp.aread()
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    pieces.append(choice["delta"]["content"])
                finish = choice.get("finish_reason") or finish
    return pieces, finish


async def test_chats_with_the_built_in_tools_on_both_connections(harness: Harness, model_path: Path) -> None:
    """The page's chat on each connection (013: OpenAI, 017: Ollama; 36 tools each), the
    follow-up tasks (title, follow-ups, tags: 012, 014, 015, 018), and a tools-attached answer
    that starts with ``[`` streamed as it comes rather than held to its end."""
    await harness.start(_config(harness, model_path))
    c = harness.client
    body = recorded(13)["body"]
    assert len(body["tools"]) == 36 and body["stream"] is True
    pieces, finish = await _sse_content(c, body)
    assert pieces and finish in ("stop", "length", "tool_calls")

    r = await replay(c, 17)  # Ollama's /api/chat, NDJSON
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines() if line]
    assert lines[-1]["done"] is True and lines[-1]["prompt_eval_count"] > 6000
    assert all("error" not in line for line in lines)
    for n in (12, 14, 15, 18):  # not streamed, no max_tokens: default_max_tokens ends them
        r = await replay(c, n)
        assert r.status_code == 200, (n, r.text)
        answer = r.json()
        text = answer["choices"][0]["message"]["content"] if "choices" in answer else answer["message"]["content"]
        assert isinstance(text, str)

    # an answer that starts with "[" while tools are attached (the recorded chat, its answer
    # made all "[" by a logit bias): not a call (a call's list holds objects), so it streams
    # from its second token on, not all at once at the end
    tok = await c.post("/tokenize", json={"model": MODEL, "content": "["})
    assert tok.status_code == 200, tok.text
    [bracket] = tok.json()["tokens"]
    pieces, finish = await _sse_content(c, {**body, "max_tokens": 24, "logit_bias": {str(bracket): 100}})
    assert "".join(pieces).startswith("[[") and finish == "length", pieces
    assert len(pieces) > 10, pieces  # held back, the whole answer would come as one piece at the end


async def test_stop_during_the_prefill_is_a_499_without_a_traceback(
        harness: Harness, model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """019: a 5,000-token message after the 36 tools, stopped from the page two seconds after
    it was sent (Open WebUI closes its connection to corral): counted as 499, no ERROR and no
    traceback in the log, and the slot serves the next chat."""
    plane = await harness.start(_config(harness, model_path))
    caplog.set_level(logging.INFO)
    r = recorded(19)
    assert r["status"] == "client left" and len(r["body"]["messages"][0]["content"]) > 19000
    async with httpx.AsyncClient(base_url=harness.base_url, timeout=900) as c:
        async with c.stream("POST", r["path"], headers=r["headers"], content=json.dumps(r["body"])) as resp:
            assert resp.status_code == 200  # the headers come before the prefill ends
            await _until(lambda: plane.pools[MODEL].inflight == 1, timeout=120)
        # the page's Stop: Open WebUI drops the connection before the first token
    await _until(lambda: plane.pools[MODEL].inflight == 0, timeout=120)
    metrics = (await harness.client.get("/metrics")).text
    counted = [line for line in metrics.splitlines() if line.startswith("corral_requests_total")]
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counted if 'status="499"' in line) == 1, counted
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info]
    assert errors == [], [rec.getMessage() for rec in errors]
    follow = await asyncio.wait_for(replay(harness.client, 18), 600)  # the tag task, on the freed slot
    assert follow.status_code == 200, follow.text


CREATED = "pirate-owui"  # 024: the admin page's "Create a model" (its JSON box: from, system, parameters)
UPLOADED = "tiny-upload"  # 032-033: the admin page's GGUF upload (POST /ollama/models/upload/0)


async def test_the_model_editor_creates_chats_shows_and_deletes(
        harness: Harness, model_path: Path, tmp_path: Path) -> None:
    """Open WebUI's admin model management, recorded (021-035): a model created FROM the
    loaded one with a system prompt and parameters answers with them in effect (its text is
    the loaded model's with that system message and those options), show returns its
    Modelfile and parameters, a GGUF uploaded as a blob (its bytes made again by testkit,
    checked against the recorded digest) becomes a model, and deleting both leaves nothing:
    no record in the state dir, no blob."""
    from testkit.draft_models import write_tiny_draft

    state, models = tmp_path / "state", tmp_path / "models"
    plane = await harness.start(_config(harness, model_path, state_dir=str(state), models_dir=str(models)))
    c = harness.client
    assert (await c.post("/models/load", json={"model": MODEL})).status_code == 200

    async def listed() -> tuple[set[str], set[str]]:
        answers = {}
        for n in (21, 22, 23):  # the lists Open WebUI reads after each change
            r = await replay(c, n)
            assert r.status_code == 200, (n, r.text)
            answers[recorded(n)["path"]] = r.json()
        return {m["id"] for m in answers["/v1/models"]["data"]}, {t["name"] for t in answers["/api/tags"]["models"]}

    r = await replay(c, 24)  # sent without "stream": Ollama's status lines
    assert r.status_code == 200, r.text
    assert [json.loads(line)["status"] for line in r.text.splitlines() if line][-1] == "success"
    for n in (25, 26, 27):
        assert (await replay(c, n)).status_code == 200
    assert all(CREATED in names for names in await listed())
    assert not plane.pools[CREATED].occupies  # a variant of the loaded model: no second load

    made = recorded(24)["body"]
    r = await replay(c, 28)  # Open WebUI's chat with the created model (Ollama's /api/chat)
    assert r.status_code == 200, r.text
    answer = r.json()
    same = await c.post("/api/chat", json={
        "model": MODEL, "stream": False, "options": made["parameters"],
        "messages": [{"role": "system", "content": made["system"]}, *recorded(28)["body"]["messages"]]})
    assert same.status_code == 200, same.text
    assert answer["message"]["content"] == same.json()["message"]["content"]  # its system and options
    assert answer["prompt_eval_count"] == same.json()["prompt_eval_count"]
    assert 0 < answer["eval_count"] <= made["parameters"]["num_predict"]
    assert answer["model"] == CREATED

    for n in (29, 30):
        assert (await replay(c, n)).status_code == 200
    r = await replay(c, 31)
    assert r.status_code == 200, r.text
    shown = r.json()
    assert shown["system"] == made["system"] and f'SYSTEM """{made["system"]}"""' in shown["modelfile"]
    assert "PARAMETER temperature 0" in shown["modelfile"] and "num_predict 24" in shown["parameters"]

    blob = recorded(32)
    data = write_tiny_draft(model_path, tmp_path / "tiny-upload.gguf").read_bytes()
    assert (hashlib.sha256(data).hexdigest(), len(data)) == (blob["body"]["sha256"], blob["body"]["bytes"]), \
        "testkit's tiny GGUF is no longer the file that was uploaded"
    r = await c.request(blob["method"], blob["path"], headers=blob["headers"], content=data)
    assert r.status_code == 201, r.text
    r = await replay(c, 33)  # {"model", "files": {name: digest}, "stream": false}
    assert r.status_code == 200, r.text
    assert json.loads(r.text.splitlines()[-1])["status"] == "success"
    assert all(UPLOADED in names for names in await listed())

    for n, gone in ((34, CREATED), (35, UPLOADED)):
        r = await replay(c, n)
        assert r.status_code == 200, r.text
        assert all(gone not in names for names in await listed())
    assert json.loads((state / "created-models.json").read_text()) == []
    assert list((models / ".corral" / "blobs").iterdir()) == []  # the upload went with its model
    assert (await replay(c, 34)).status_code == 404  # a second delete: Open WebUI shows the error
