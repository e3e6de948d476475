"""POST /slots/{id}?action=save|restore|erase (llama-server's slot API) over fake workers:
the answers' shapes, slot ids across instances, the errors, and that a filename cannot
leave ``slots/`` in the state dir (the real worker's side: tests/e2e/test_slot_files_e2e.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.harness import Harness, _until

from corral import wire

JSON = {"content-type": "application/json"}


async def _start(harness: Harness, models: dict[str, dict] | None = None) -> Path:
    state = harness.tmp / "state"
    models = models or {"a": {"path": str(harness.script("a")), "n_parallel": 2, "load_on_startup": True}}
    await harness.serve(models, state_dir=str(state))
    for spec in models:
        r = await harness.client.post("/models/load", json={"model": spec})
        assert r.status_code == 200, r.text
    return state


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
            and not p.name.endswith((".log", ".settings", ".json"))}


async def test_save_restore_erase_answer_in_llama_servers_shape(harness: Harness) -> None:
    state = await _start(harness)
    c = harness.client
    r = await c.post("/slots/1?action=save", json={"filename": "chat-1.bin"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id_slot": 1, "filename": "chat-1.bin", "n_saved": 3, "n_written": 9,
                        "timings": {"save_ms": 1.5}}
    assert (state / "slots" / "chat-1.bin").read_bytes() == b"FAKESLOT1"  # slot 1 of the one instance
    r = await c.post("/slots/0?action=restore", json={"filename": "chat-1.bin"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id_slot": 0, "filename": "chat-1.bin", "n_restored": 3, "n_read": 9,
                        "timings": {"restore_ms": 0.5}}
    r = await c.post("/slots/0?action=erase&model=a")
    assert r.status_code == 200, r.text
    assert r.json() == {"id_slot": 0, "n_erased": 3}
    seen = [m for m in harness.requests_seen("a") if m.get("type") == "slot_file"]
    assert [(m["action"], m["slot"]) for m in seen] == [("save", 1), ("restore", 0), ("erase", 0)]
    assert seen[0]["directory"] == str(state / "slots") and seen[2]["directory"] == ""


async def test_slot_ids_are_numbered_across_instances(harness: Harness) -> None:
    await _start(harness, {"a": {"path": str(harness.script("a")), "n_parallel": 2, "instances": 2}})
    c = harness.client
    await _until(lambda: sum(i.ready_link is not None for i in harness.plane.pool("a").instances) == 2)
    r = await c.post("/slots/3?action=save", json={"filename": "s3.bin"})
    assert r.status_code == 200, r.text
    assert r.json()["id_slot"] == 3
    seen = [m for m in harness.requests_seen("a") if m.get("type") == "slot_file"]
    assert [m["slot"] for m in seen] == [1]  # the second instance's slot 1
    r = await c.post("/slots/4?action=erase")
    assert r.status_code == 400 and "Invalid slot ID" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["", "../escape.bin", "..", "a/b.bin", "/etc/passwd", "a\\b.bin",
                                  ".hidden", "x..y", " lead.bin", "nul\x00.bin", "new\nline", "x" * 256])
async def test_a_filename_that_could_leave_slots_dir_is_a_400(harness: Harness, name: str) -> None:
    await _start(harness)
    before = _files(harness.tmp)
    for action in ("save", "restore"):
        r = await harness.client.post(f"/slots/0?action={action}", json={"filename": name})
        assert r.status_code == 400, (action, name, r.text)
        assert "Invalid filename" in r.json()["error"]["message"]
    assert _files(harness.tmp) == before  # nothing written anywhere
    assert not [m for m in harness.requests_seen("a") if m.get("type") == "slot_file"]  # no worker asked


async def test_errors_are_llama_servers(harness: Harness) -> None:
    await _start(harness)
    c = harness.client
    cases = [("/slots/0?action=fly", {"filename": "a"}, "Invalid action"),
             ("/slots/0", {"filename": "a"}, "Invalid action"),
             ("/slots/x?action=save", {"filename": "a"}, "Invalid slot ID"),
             ("/slots/-1?action=save", {"filename": "a"}, "Invalid slot ID"),
             ("/slots/2?action=save", {"filename": "a"}, "Invalid slot ID"),  # 2 slots: 0 and 1
             ("/slots/0?action=save", {}, "Invalid filename"),
             ("/slots/0?action=save", {"filename": 7}, "Invalid filename"),
             ("/slots/0?action=restore", {"filename": "never-saved.bin"}, "Unable to restore slot"),
             ("/slots/0?action=erase&model=nope", None, "nope")]
    for url, body, message in cases:
        r = await c.post(url, json=body) if body is not None else await c.post(url)
        assert 400 <= r.status_code < 500, (url, r.text)
        assert message in r.json()["error"]["message"], (url, r.text)


async def test_a_model_not_loaded_has_no_slots(harness: Harness) -> None:
    await harness.serve({"a": {"path": str(harness.script("a"))}},
                        state_dir=str(harness.tmp / "state"))
    r = await harness.client.post("/slots/0?action=erase")
    assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]


async def test_a_cross_site_post_changes_nothing(harness: Harness) -> None:
    state = await _start(harness)
    c = harness.client
    r = await c.post("/slots/0?action=save", json={"filename": "x.bin"},
                     headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    # a browser's form or text/plain body (no preflight) is refused too
    r = await c.post("/slots/0?action=save", content=b'{"filename": "x.bin"}',
                     headers={"content-type": "text/plain"})
    assert r.status_code == 415
    assert not (state / "slots" / "x.bin").exists()
    assert not [m for m in harness.requests_seen("a") if m.get("type") == "slot_file"]


def test_the_router_and_the_worker_share_one_filename_rule() -> None:
    assert wire.filename_problem("chat-1.bin") is None
    assert wire.filename_problem("ümlaut état.bin") is None
    assert all(wire.filename_problem(n) for n in ("", "..", "a/b", ".x", "a\\b", "a\x01"))
    assert os.sep == "/"  # (the rule also refuses "\\" for Windows' sake)
