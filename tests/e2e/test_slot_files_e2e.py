"""llama-server's slot API with a real worker and the embedded Gemma 3 (sliding-window
attention): save -> erase -> restore gives the slot its prefix back, and the next request
reuses it and answers exactly what it answers with the prefix kept in the slot all along;
a file for other settings, or a changed one, is refused and the slot still answers.

A reused prefix stops where the prompt's last cut began (its last 4 tokens, decoded again in
the batch shape a fresh prefill gives them: worker/prefill.py), so the answer after a kept or
a restored prefix is the fresh prefill's, token for token (until 2026-12-03 only the last
token was recomputed, in a batch of one, and the greedy text parted from its second token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.harness import Harness

pytestmark = pytest.mark.integration

PROMPT = "The history of the lighthouse keepers of the northern coast, told in order: " * 12


async def _start(harness: Harness, model_path: Path, ctx_len: int = 2048) -> Path:
    state = harness.tmp / "state"
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": ctx_len, "n_parallel": 1, "threads": 1}},
                         worker_command=None, state_dir=str(state))
    await harness.start(cfg)
    r = await harness.client.post("/models/load", json={"model": "gemma"})
    assert r.status_code == 200, r.text
    return state


async def _complete(harness: Harness) -> dict[str, Any]:
    r = await harness.client.post("/v1/completions", json={
        "model": "gemma", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "logprobs": 1})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def _slot(harness: Harness, action: str, filename: str | None = None) -> Any:
    r = await harness.client.post(f"/slots/0?action={action}",
                                  json={"filename": filename} if filename is not None else None)
    return r


async def test_save_erase_restore_reuses_the_prefix_with_the_same_tokens(harness: Harness, model_path: Path) -> None:
    state = await _start(harness, model_path)
    first = await _complete(harness)  # a fresh prefill
    n_prompt = first["usage"]["prompt_tokens"]
    assert n_prompt > 100
    kept = await _complete(harness)  # the prefix kept in the slot
    assert kept["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 4
    assert kept["choices"][0]["text"] == first["choices"][0]["text"]
    saved = (await _slot(harness, "save", "lighthouse.bin")).json()
    assert saved["id_slot"] == 0 and saved["filename"] == "lighthouse.bin"
    assert saved["n_saved"] == n_prompt + 7  # the prompt and the generated tokens but the last (never decoded)
    path = state / "slots" / "lighthouse.bin"
    assert saved["n_written"] == path.stat().st_size > 0 and saved["timings"]["save_ms"] > 0
    assert (state / "slots" / ".lighthouse.bin.corral").is_file()
    assert not [p for p in (state / "slots").iterdir() if p.name.endswith(".tmp")]  # no temp file left

    erased = (await _slot(harness, "erase")).json()
    assert erased == {"id_slot": 0, "n_erased": n_prompt + 7}
    slots = (await harness.client.get("/slots")).json()
    assert slots[0]["n_cached"] == 0

    restored = (await _slot(harness, "restore", "lighthouse.bin")).json()
    assert restored["n_restored"] == n_prompt + 7 and restored["n_read"] == saved["n_written"]
    assert (await harness.client.get("/slots")).json()[0]["n_cached"] == n_prompt + 7

    again = await _complete(harness)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 4  # the prefix came back
    assert again["choices"][0]["text"] == kept["choices"][0]["text"]
    assert again["choices"][0]["logprobs"]["token_logprobs"] == kept["choices"][0]["logprobs"]["token_logprobs"]
    assert again["choices"][0]["logprobs"]["token_logprobs"] == first["choices"][0]["logprobs"]["token_logprobs"]

    # erased and not restored: a full prefill again, the same tokens
    await _slot(harness, "erase")
    fresh = await _complete(harness)
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert fresh["choices"][0]["text"] == first["choices"][0]["text"]


async def test_a_changed_file_or_other_settings_are_refused(harness: Harness, model_path: Path) -> None:
    state = await _start(harness, model_path)
    first = await _complete(harness)
    assert (await _slot(harness, "save", "a.bin")).status_code == 200
    path = state / "slots" / "a.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit flipped in the KV data
    path.write_bytes(bytes(data))
    r = await _slot(harness, "restore", "a.bin")
    assert r.status_code == 400 and "checksum" in r.json()["error"]["message"]
    assert (await harness.client.get("/slots")).json()[0]["n_cached"] > 0  # the slot untouched
    path.write_bytes(bytes(data[:100]))  # truncated
    r = await _slot(harness, "restore", "a.bin")
    assert r.status_code == 400 and "checksum" in r.json()["error"]["message"]
    assert (await _slot(harness, "save", "b.bin")).status_code == 200
    await harness.stop()

    # the same model with another context: the state does not belong to it
    await _start(harness, model_path, ctx_len=1024)
    r = await _slot(harness, "restore", "b.bin")
    assert r.status_code == 400, r.text
    assert "other settings" in r.json()["error"]["message"] and "n_ctx_slot" in r.json()["error"]["message"]
    again = await _complete(harness)  # the slot still answers, from a fresh prefill
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
