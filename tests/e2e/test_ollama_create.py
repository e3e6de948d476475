"""Ollama's create with the official ``ollama`` client (api/ollama/create.py): a model FROM
an existing one and one from an uploaded blob, each with a system prompt, parameters and an
opening message; chat, show and delete them; what was created outlives a restart (the state
file owner-only). Bad input (FROM a missing model, a blob whose digest does not match, a Go
template, an unknown parameter, a name another model has) is a 4xx and creates nothing."""

from __future__ import annotations

import hashlib
import stat
import sys
from pathlib import Path

import httpx
import ollama
import pytest

from corral.control.created_models import FILE_NAME
from support.harness import Harness

SPY = Path(__file__).parent.parent / "support" / "sampler_spy.py"
pytestmark = pytest.mark.integration


async def test_create_from_a_model_and_from_a_blob_then_chat_show_delete(
        harness: Harness, model_path: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    out = tmp_path / "sampler.jsonl"
    cfg = harness.config({"gemma": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 1}},
                         worker_command=[sys.executable, str(SPY), str(out)], state_dir=str(state),
                         models_dir=str(tmp_path / "models"))
    plane = await harness.start(cfg)
    client = ollama.AsyncClient(host=harness.base_url)

    lines = [p.status async for p in await client.create(
        model="mario", from_="gemma", system="You are Mario.", parameters={"temperature": 0.25, "top_k": 7,
                                                                           "num_predict": 4, "stop": ["\n\n"]},
        messages=[{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "It's-a me!"}],
        license="MIT", stream=True)]
    assert lines[-1] == "success"
    r = await client.chat(model="mario", messages=[{"role": "user", "content": "Hi"}])
    assert r.done and 0 < r.eval_count <= 4
    plain_chat = await client.chat(model="gemma", messages=[{"role": "user", "content": "Hi"}],
                                   options={"num_predict": 1})
    assert r.prompt_eval_count > plain_chat.prompt_eval_count + 10  # its system and opening turns
    seen = out.read_text().splitlines()[-2]
    assert '"temperature":0.25' in seen and '"top_k":7' in seen and '"stop":["\\n\\n"]' in seen
    shown = await client.show("mario")
    assert 'SYSTEM """You are Mario."""' in (shown.modelfile or "") and "temperature 0.25" in (shown.parameters or "")
    assert shown.license == "MIT"
    plain = await client.show("gemma")
    assert "SYSTEM" not in (plain.modelfile or "")  # the model it came from is unchanged

    digest = await client.create_blob(model_path)
    assert (await httpx.AsyncClient(base_url=harness.base_url).head(f"/api/blobs/{digest}")).status_code == 200
    r2 = await client.create(model="from-blob", files={"gemma-3-270m.gguf": digest},
                             parameters={"temperature": 0.0, "num_ctx": 512})
    assert r2.status == "success"
    listed = {m.model for m in (await client.list()).models}
    assert {"mario", "from-blob", "gemma"} <= listed
    r = await client.generate(model="from-blob", prompt="Hi", options={"num_predict": 2})
    assert r.done
    assert plane.pools["from-blob"].spec.path == tmp_path / "models" / ".corral" / "blobs" / f"sha256-{digest[7:]}"

    kept = state / FILE_NAME
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and "You are Mario." in kept.read_text()
    await harness.stop()
    plane = await harness.start(cfg)  # a restart: both are back
    client = ollama.AsyncClient(host=harness.base_url)
    assert {"mario", "from-blob"} <= {m.model for m in (await client.list()).models}
    assert plane.pools["mario"].spec.system == "You are Mario."

    await client.delete("mario")
    assert "mario" not in {m.model for m in (await client.list()).models}
    assert "mario" not in kept.read_text()
    with pytest.raises(ollama.ResponseError):
        await client.chat(model="mario", messages=[{"role": "user", "content": "Hi"}])


async def test_bad_creates_are_4xx_and_create_nothing(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = harness.config({"gemma": {"path": str(model_path)}}, worker_command=None, state_dir=str(state),
                         models_dir=str(tmp_path / "models"))
    plane = await harness.start(cfg)
    c = harness.client
    assert c is not None
    before = set(plane.pools)

    async def create(**body: object) -> httpx.Response:
        return await c.post("/api/create", json={"model": "new", **body})

    r = await create(**{"from": "no-such-model"})
    assert r.status_code == 404 and "from: model 'no-such-model' not found" in r.text
    r = await create(**{"from": "gemma", "template": "{{ .System }} {{ .Prompt }}"})
    assert r.status_code == 400 and "Go" in r.text
    r = await create(**{"from": "gemma", "parameters": {"mirostat": 2}})
    assert r.status_code == 400 and "parameters.mirostat" in r.text
    r = await create(**{"from": "gemma", "parameters": {"temperature": 7}})
    assert r.status_code == 400 and "parameters.temperature" in r.text
    r = await create(**{"from": "gemma", "quantize": "q4_K_M"})
    assert r.status_code == 400 and "quantize" in r.text
    r = await c.post("/api/create", json={"model": "gemma", "from": "gemma"})
    assert r.status_code == 409  # another model's name
    data = b"GGUF" + b"\x00" * 100
    wrong = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    r = await c.post(f"/api/blobs/{wrong}", content=data)
    assert r.status_code == 400 and "hash to" in r.text
    assert (await c.head(f"/api/blobs/{wrong}")).status_code == 404
    blobs = tmp_path / "models" / ".corral" / "blobs"
    assert not any(blobs.iterdir())  # nothing half-kept
    r = await c.post("/api/blobs/sha256:not-hex", content=data)
    assert r.status_code == 400
    r = await create(files={"m.gguf": "sha256:" + hashlib.sha256(data).hexdigest()})
    assert r.status_code == 400 and "upload it first" in r.text
    assert set(plane.pools) == before and not (state / FILE_NAME).exists()
    r = await c.post("/v1/completions", json={"model": "gemma", "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200  # the other models unaffected


async def test_a_blob_goes_with_the_last_model_made_from_it(harness: Harness, model_path: Path,
                                                           tmp_path: Path) -> None:
    """Two models made from one uploaded GGUF (the second FROM the first): deleting one keeps
    the blob, deleting the last deletes it (Ollama prunes a deleted model's layers so)."""
    cfg = harness.config({"gemma": {"path": str(model_path)}}, worker_command=None, state_dir=str(tmp_path / "state"),
                         models_dir=str(tmp_path / "models"))
    await harness.start(cfg)
    client = ollama.AsyncClient(host=harness.base_url)
    digest = await client.create_blob(model_path)
    blob = tmp_path / "models" / ".corral" / "blobs" / f"sha256-{digest[7:]}"
    assert (await client.create(model="one", files={"m.gguf": digest})).status == "success"
    assert (await client.create(model="two", from_="one", system="x")).status == "success"
    await client.delete("one")
    assert blob.is_file()  # "two" runs on it
    await client.delete("two")
    assert not blob.exists()
    assert model_path.is_file()  # a configured model's file is never pruned
