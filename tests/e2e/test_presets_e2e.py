"""A server started from a llama.cpp preset (``[server] models_preset``) with a real
worker: the preset's models are listed, none is loaded that was not asked for
(``load-on-startup`` is), requests sample with the section's settings, and a reload
re-reads the file (a changed sampling default restarts nothing; a bad edit changes nothing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from corral.config.file import load_config
from support.harness import Harness

SPY = Path(__file__).parent.parent / "support" / "sampler_spy.py"


async def test_a_preset_serves_its_models_and_reload_rereads_it(harness: Harness, model_path: Path) -> None:
    out = harness.tmp / "sampler.jsonl"
    preset = harness.tmp / "models.ini"
    preset.write_text(f"version = 1\n[*]\nc = 1024\nnp = 1\n[qwen-style]\nmodel = {model_path}\ntemp = 0.6\n"
                      f"top-k = 20\n[other]\nm = {model_path}\nalias = the-other\n")
    toml = harness.tmp / "corral.toml"
    server = harness.server_table(worker_command=[sys.executable, str(SPY), str(out)], models_preset=str(preset))
    toml.write_text("[server]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in server.items()))
    plane = await harness.start(load_config(toml), loader=lambda: load_config(toml))
    c = harness.client
    assert c is not None
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert set(listed) == {"qwen-style", "other"}
    assert {m["status"]["value"] for m in listed.values()} == {"unloaded"}  # nothing it was not asked for
    assert listed["other"]["aliases"] == ["the-other"] and listed["qwen-style"]["source"] == "preset"
    r = await c.post("/v1/completions", json={"model": "qwen-style", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert not plane.is_loaded("other")

    preset.write_text(preset.read_text().replace("temp = 0.6", "temp = 0.3"))
    r = await c.post("/models/reload")
    assert r.status_code == 200, r.text
    assert r.json()["updated"] == ["qwen-style"] and r.json()["restarted"] == []  # a default: no restart
    r = await c.post("/v1/completions", json={"model": "qwen-style", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200, r.text
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert (first["temperature"], first["top_k"], second["temperature"]) == (0.6, 20, 0.3)

    preset.write_text(preset.read_text() + "[broken]\nctx-size = 2048\n")  # no model: the reload changes nothing
    r = await c.post("/models/reload")
    assert r.status_code == 400, r.text
    assert "[broken]: no model" in r.text and "Traceback" not in r.text
    assert set(m["id"] for m in (await c.get("/models")).json()["data"]) == {"qwen-style", "other"}
    assert plane.is_loaded("qwen-style")
