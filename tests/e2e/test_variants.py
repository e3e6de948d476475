"""Variants share one loaded model (control/plane.py's serving): the Nitro seed's two load
calls (one file, the same context and GPU layers, another pre_prompt) end with one worker
process; both ids answer at the same time, each with its own pre_prompt (greedy text equal
to that id served alone), under its own id, listed with variant_of and no memory of its own."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from support.harness import Harness
from support.waiting import until_async


def _load(model_id: str, path: Path, pre: str) -> dict[str, Any]:
    return {"model_id": model_id, "llama_model_path": str(path), "ctx_len": 512, "ngl": 0, "embedding": False,
            "pre_prompt": pre, "user_prompt": "USER: ", "ai_prompt": "ASSISTANT: "}


async def test_the_nitro_seeds_two_loads_end_with_one_worker(harness: Harness, model_path: Path) -> None:
    await harness.start(harness.config({}, worker_command=None, allowed_model_dirs=[str(model_path.parent)]))
    plane = harness.plane
    c = harness.client
    assert c is not None and plane is not None
    a, b = "tinyllama-1.1b-chat-v0.3", "tinyllama-1.1b-chat-v0.3-copy"
    r = await c.post("/inferences/llamacpp/loadmodel",
                     json=_load(a, model_path, "A chat between a curious user and an artificial intelligence"))
    assert r.status_code == 200, r.text
    r = await c.post("/inferences/llamacpp/loadmodel", json=_load(b, model_path, "You are a pirate. Say arr."))
    assert r.status_code == 200, r.text
    assert len(plane.pools[a].instances) == 1 and plane.pools[b].instances == []  # one worker process
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert listed[b]["variant_of"] == a and listed[a]["variant_of"] is None
    assert listed[b]["memory_bytes"] == 0 and listed[a]["memory_bytes"] > 0  # the weights once

    async def ask(model: str) -> dict[str, Any]:
        r = await c.post("/v1/chat/completions", json={
            "model": model, "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": "What is the biggest tech company?"}]})
        assert r.status_code == 200, r.text
        return r.json()

    ra, rb = await asyncio.gather(ask(a), ask(b))
    assert (ra["model"], rb["model"]) == (a, b)
    assert ra["usage"]["prompt_tokens"] != rb["usage"]["prompt_tokens"]  # each its own pre_prompt
    assert len(plane.pools[a].instances) == 1 and plane.pools[b].instances == []
    metrics = (await c.get("/metrics")).text
    assert f'model="{b}"' in metrics
    rendered = {}
    for mid in (a, b):  # /apply-template renders each id's own pre_prompt, on the one worker
        r = await c.post("/apply-template", json={"model": mid, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        rendered[mid] = r.json()["prompt"]
    assert rendered[b].startswith("You are a pirate.") and rendered[a].startswith("A chat between")
    assert plane.pools[b].instances == []

    await plane.unload(plane.pools[a])  # now b alone: it loads for itself and answers the same
    alone = await ask(b)
    assert len(plane.pools[b].instances) == 1
    assert alone["choices"][0]["message"]["content"] == rb["choices"][0]["message"]["content"]
    assert alone["usage"]["prompt_tokens"] == rb["usage"]["prompt_tokens"]


def _table(model_path: Path, **kw: Any) -> dict[str, Any]:
    return {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1, **kw}


PIRATE = {"system": "You are a pirate. Answer like one.", "temperature": 0.0, "default_max_tokens": 12}


async def _ask(h: Harness, body: dict[str, Any]) -> dict[str, Any]:
    r = await h.client.post("/v1/chat/completions", json={
        **body, "messages": [{"role": "user", "content": "What is the biggest tech company?"}]})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def _pirate_and_plain(h: Harness, pirate: str) -> tuple[dict[str, Any], dict[str, Any]]:
    # the pirate sends nothing: its table's system prompt, temperature and token limit apply
    return await asyncio.gather(_ask(h, {"model": pirate}),
                                _ask(h, {"model": "plain", "temperature": 0, "max_tokens": 12}))


async def test_two_tables_of_one_file_are_one_worker(harness: Harness, model_path: Path) -> None:
    """[models] tables equal in all a load fixes: the second is a variant of the loaded first
    (one worker, its own system prompt and defaults, its own id in /models, /api/ps, metrics);
    its greedy text is the one it answers served alone."""
    await harness.start(harness.config({"plain": _table(model_path), "pirate": _table(model_path, **PIRATE)},
                                       worker_command=None))
    plane, c = harness.plane, harness.client
    assert (await c.post("/models/load", json={"model": "plain"})).status_code == 200
    rp, rq = await _pirate_and_plain(harness, "pirate")
    assert len(plane.pools["plain"].instances) == 1 and plane.pools["pirate"].instances == []  # one worker
    assert (rp["model"], rq["model"]) == ("pirate", "plain")
    assert rp["usage"]["prompt_tokens"] > rq["usage"]["prompt_tokens"]  # its system prompt went with it
    assert rp["usage"]["completion_tokens"] <= 12
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert listed["pirate"]["variant_of"] == "plain" and listed["plain"]["variant_of"] is None
    assert listed["pirate"]["memory_bytes"] == 0 and listed["plain"]["memory_bytes"] > 0
    ps = {m["name"]: m for m in (await c.get("/api/ps")).json()["models"]}
    assert ps["pirate"]["variant_of"] == "plain" and "variant_of" not in ps["plain"]
    assert ps["pirate"]["size"] == ps["plain"]["size"] > 0  # the one worker's memory, not twice loaded
    assert 'model="pirate"' in (await c.get("/metrics")).text

    await plane.unload(plane.pools["plain"])  # the pirate alone: its own worker, the same answer
    alone = await _ask(harness, {"model": "pirate"})  # (asked with plain's at once, either one may load)
    assert len(plane.pools["pirate"].instances) == 1
    assert alone["choices"][0]["message"]["content"] == rp["choices"][0]["message"]["content"]
    assert alone["usage"] == rp["usage"]


async def test_own_instances_and_a_reloaded_load_setting_make_models_of_their_own(harness: Harness) -> None:
    """A variant table edited (reload) to differ in a load setting gets a worker of its own from
    its next request, the other's untouched; own_instances = true in both tables: two workers."""
    path = str(harness.script("m"))
    configs = [harness.config({"a": {"path": path}, "b": {"path": path, "system": "x"}})]
    plane = await harness.start(configs[0], loader=lambda: configs[-1])
    c = harness.client

    async def ask(model: str) -> None:
        r = await c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model

    assert (await c.post("/models/load", json={"model": "a"})).status_code == 200
    await ask("b")
    assert plane.pools["b"].instances == []  # a variant
    pid = plane.pools["a"].instances[0].pid
    configs.append(harness.config({"a": {"path": path}, "b": {"path": path, "system": "x", "ctx_len": 2048}}))
    assert (await c.post("/models/reload")).status_code == 200
    await ask("b")
    assert plane.pools["b"].occupies and plane.pools["a"].instances[0].pid == pid
    listed = {m["id"]: m for m in (await c.get("/models")).json()["data"]}
    assert listed["b"]["variant_of"] is None

    configs.append(harness.config({"a": {"path": path, "own_instances": True},
                                   "b": {"path": path, "system": "x", "own_instances": True}}))
    assert (await c.post("/models/reload")).status_code == 200
    await plane.unload(plane.pools["b"])
    assert plane.pools["a"].instances[0].pid == pid  # own_instances restarts no worker
    assert not plane.pools["b"].occupies
    await ask("b")
    assert plane.pools["b"].occupies and plane.pools["a"].occupies  # two models, a worker each


async def test_a_loadmodel_that_would_change_a_loaded_models_setting_is_refused(harness: Harness) -> None:
    """Nitro's loadmodel of a [models] table's id asking another ctx_len: 409 naming ctx_len,
    nothing changed (the worker, the table's settings), the model answers; the same body under
    a new id is a model of its own (its context differs), and a new id that differs only in its
    prompts is a variant."""
    path = harness.script("m")
    plane = await harness.start(harness.config({"a": {"path": str(path), "ctx_len": 1024}},
                                               allowed_model_dirs=[str(harness.tmp)]))
    c = harness.client
    assert (await c.post("/models/load", json={"model": "a"})).status_code == 200
    pid = plane.pools["a"].instances[0].pid

    def body(mid: str, **kw: Any) -> dict[str, Any]:
        return {"model_id": mid, "llama_model_path": str(path), **kw}

    r = await c.post("/inferences/llamacpp/loadmodel", json=body("a", ctx_len=2048, pre_prompt="P"))
    assert r.status_code == 409, r.text
    assert "ctx_len" in r.text and "1024" in r.text and "2048" in r.text
    assert plane.pools["a"].instances[0].pid == pid and plane.pools["a"].spec.ctx_len == 1024
    assert plane.pools["a"].spec.source == "config" and plane.pools["a"].spec.pre_prompt is None
    r = await c.post("/v1/completions", json={"model": "a", "prompt": "x"})
    assert r.status_code == 200, r.text
    assert (await c.post("/inferences/llamacpp/loadmodel", json=body("a", ctx_len=1024))).status_code == 200

    assert (await c.post("/inferences/llamacpp/loadmodel", json=body("b", ctx_len=2048))).status_code == 200
    assert plane.pools["b"].occupies  # another context: its own worker
    r = await c.post("/inferences/llamacpp/loadmodel", json=body("v", ctx_len=1024, pre_prompt="P"))
    assert r.status_code == 200, r.text
    assert not plane.pools["v"].occupies and plane.variant_of(plane.pools["v"]) == "a"


async def test_two_tables_loaded_on_startup_start_one_worker(harness: Harness) -> None:
    """Both tables load_on_startup: the second is the first's variant, no second worker (two
    loads at once would each have started one)."""
    path = str(harness.script("m"))
    plane = await harness.start(harness.config({"a": {"path": path, "load_on_startup": True},
                                                "b": {"path": path, "system": "x", "load_on_startup": True}}))
    await until_async(lambda: plane.pools["a"].has_ready)
    assert not plane.pools["b"].occupies
    r = await harness.client.post("/v1/chat/completions", json={"model": "b", "messages": [{"role": "user",
                                                                                           "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert plane.pools["a"].occupies and not plane.pools["b"].occupies


async def test_two_variants_first_requests_at_once_start_one_worker(harness: Harness, model_path: Path) -> None:
    """Nothing loaded, the first requests of two tables of one file arrive together: the load
    is decided under the lock that starts it (Admission.load), so the second rides on the
    worker the first started; both answered, each under its own id and its own system prompt."""
    await harness.start(harness.config({"plain": _table(model_path), "pirate": _table(model_path, **PIRATE)},
                                       worker_command=None))
    plane = harness.plane
    rp, rq = await _pirate_and_plain(harness, "pirate")
    assert (rp["model"], rq["model"]) == ("pirate", "plain")
    assert rp["usage"]["prompt_tokens"] > rq["usage"]["prompt_tokens"]  # its system prompt went with it
    workers = [i for p in plane.pools.values() for i in p.instances]
    assert len(workers) == 1  # one worker process for both
    host = next(p for p in plane.pools.values() if p.occupies)
    other = plane.pools["plain" if host.spec.id == "pirate" else "pirate"]
    assert plane.variant_of(other) == host.spec.id


async def test_a_variant_is_listed_with_the_status_of_the_model_serving_it(harness: Harness) -> None:
    """While its host loads and once it is loaded, a variant is listed (GET /models,
    /v1/models, /v1/models/ID) with the host's status and variant_of: it answers with no
    load of its own; once the host unloads it is unloaded again, a variant of nothing."""
    path = str(harness.script("m", load_delay_s=1.0))
    plane = await harness.start(harness.config({"a": {"path": path}, "b": {"path": path, "system": "x"}}))
    c = harness.client

    async def listed(mid: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        corral = {m["id"]: m for m in (await c.get("/models")).json()["data"]}[mid]
        openai = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}[mid]
        one = (await c.get(f"/v1/models/{mid}")).json()
        return corral, openai, one

    for entry in await listed("b"):
        assert entry["status"]["value"] == "unloaded" and entry.get("variant_of") is None
    loading = asyncio.create_task(plane.load(plane.pools["a"]))
    await until_async(lambda: plane.pools["a"].status() == "loading")
    for entry in await listed("b"):
        assert entry["status"]["value"] == "loading" and entry["variant_of"] == "a"
    await loading
    for entry in await listed("b"):
        assert entry["status"]["value"] == "loaded" and entry["variant_of"] == "a"
    host = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}["a"]
    assert "variant_of" not in host and host["status"]["value"] == "loaded"
    assert not plane.pools["b"].occupies  # listed so, loaded nothing of its own

    await plane.unload(plane.pools["a"])
    for entry in await listed("b"):
        assert entry["status"]["value"] == "unloaded" and entry.get("variant_of") is None


async def _stream_until_end(c: Any, model: str, started: asyncio.Event) -> tuple[str, str | None]:
    """A streamed chat: its text and how it ended (the finish reason, or the error event's type)."""
    text, end = "", None
    async with c.stream("POST", "/v1/chat/completions", json={
            "model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                end = f"error {chunk['error']['type']}"
                continue
            for ch in chunk["choices"]:
                text += ch["delta"].get("content") or ""
                end = ch.get("finish_reason") or end
            started.set()
    return text, end


@pytest.mark.parametrize("drain_s", [30.0, 0.0])
async def test_unloading_the_host_ends_a_variants_request_as_the_hosts_own(harness: Harness, drain_s: float) -> None:
    """The host unloads while its own request and a variant's stream: both end alike (drained:
    both finish; no drain: both cut with finish_reason "abort"); the variant's next request
    loads the weights again (autoload: the variant on a worker of its own, as a variant of
    nothing loaded does) and answers."""
    tokens = [f" t{i}" for i in range(40)]
    path = str(harness.script("m", tokens=tokens, token_delay_s=0.05))
    plane = await harness.start(harness.config({"a": {"path": path}, "b": {"path": path, "system": "x"}},
                                               drain_timeout_s=drain_s))
    c = harness.client
    assert (await c.post("/models/load", json={"model": "a"})).status_code == 200
    started = {m: asyncio.Event() for m in ("a", "b")}
    streams = {m: asyncio.create_task(_stream_until_end(c, m, started[m])) for m in ("a", "b")}
    await asyncio.gather(*(e.wait() for e in started.values()))
    assert not plane.pools["b"].occupies  # b runs on a's worker
    await plane.unload(plane.pools["a"])
    (text_a, end_a), (text_b, end_b) = await asyncio.gather(*streams.values())
    if drain_s:  # drained: both finish
        assert end_a == end_b == "stop" and text_a == text_b == "".join(tokens)
    else:  # no drain: both cut, told so (finish_reason "abort", then [DONE])
        assert end_a == end_b == "abort" and len(text_a) < len("".join(tokens)) and len(text_b) < len("".join(tokens))
    assert not plane.pools["a"].occupies
    r = await c.post("/v1/chat/completions", json={"model": "b", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "b" and r.json()["choices"][0]["message"]["content"] == "".join(tokens)
    assert len([i for p in plane.pools.values() for i in p.instances if i.holds_memory]) == 1
