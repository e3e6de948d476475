"""The hostile colleague's prompt-cache attack (issue 33, part 1), replayed with real workers,
the real model and two keys of one keys file.

Alice sends a prompt that holds a secret PIN. Mallory, with a key of her own, sends the same
prompt shape with candidate PINs and reads how many prompt tokens each answer says were
cached (``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``,
Responses' ``input_tokens_details.cached_tokens``). Shared, the right guess reuses Alice's
whole prompt; isolated by tenant (``corral.control.keys.cache_tenant``), every guess reports the
same count, that of Mallory's own earlier guesses, through slot reuse, the RAM prompt cache,
the disk cache after a swap and a restored slot file alike. Keys of one ``cache_group`` do
share; the same key with another ``cache_salt`` does not; a server without keys shares as
before. A ``cache_salt`` that is no string, or too long, is a 400 in each dialect's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from support.harness import Harness
from support.keys import bearer, write_keys_file

pytestmark = pytest.mark.integration

SECRET = "4817"
# each differs from every other (and from the first guess) in its first digit: the prefix
# Mallory shares with her own earlier guesses is the same for each
GUESSES = ["1093", "2741", SECRET, "6350", "8526"]
WARM_UP = "0000"  # Mallory's first guess: her own prefix is in the cache after it
HEAD = ("You are the front desk assistant of the Harbour Street office. Answer visitors briefly and "
        "politely, and never read out codes.")
TAIL = " ".join(f"Rule {i}: visitors sign in at desk {i % 4} and wear badge colour {('red', 'blue', 'green')[i % 3]}."
                for i in range(10))


def _text(pin: str) -> str:
    return f"The door PIN is {pin}. {TAIL} Question: where do I sign in?"


def _body(dialect: str, pin: str, salt: str | None) -> tuple[str, dict[str, Any]]:
    extra = {} if salt is None else {"cache_salt": salt}
    if dialect == "completions":
        return "/v1/completions", {"model": "m", "prompt": f"{HEAD}\n{_text(pin)}", "max_tokens": 1,
                                   "temperature": 0, **extra}
    if dialect == "chat":
        return "/v1/chat/completions", {"model": "m", "max_tokens": 1, "temperature": 0, **extra,
                                        "messages": [{"role": "system", "content": HEAD},
                                                     {"role": "user", "content": _text(pin)}]}
    if dialect == "messages":
        return "/v1/messages", {"model": "m", "max_tokens": 1, "temperature": 0, "system": HEAD, **extra,
                                "messages": [{"role": "user", "content": _text(pin)}]}
    assert dialect == "responses"
    return "/v1/responses", {"model": "m", "max_output_tokens": 1, "temperature": 0, "store": False,
                             "instructions": HEAD, "input": _text(pin), **extra}


def _cached(dialect: str, body: dict[str, Any]) -> tuple[int, int]:
    """(cached prompt tokens, prompt tokens) as the dialect reports them."""
    u = body["usage"]
    if dialect in ("completions", "chat"):
        return u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"]
    if dialect == "messages":
        return u["cache_read_input_tokens"], u["input_tokens"] + u["cache_read_input_tokens"]
    return u["input_tokens_details"]["cached_tokens"], u["input_tokens"]


async def ask(h: Harness, who: dict[str, str], pin: str, dialect: str = "completions",
              salt: str | None = None) -> tuple[int, int]:
    url, body = _body(dialect, pin, salt)
    r = await h.client.post(url, json=body, headers=who)
    assert r.status_code == 200, r.text
    return _cached(dialect, r.json())


async def guesses(h: Harness, who: dict[str, str], dialect: str = "completions") -> dict[str, int]:
    """Mallory's warm-up guess, then each candidate's cached count."""
    await ask(h, who, WARM_UP, dialect)
    return {pin: (await ask(h, who, pin, dialect))[0] for pin in GUESSES}


def models(model_path: Path, **kw: Any) -> dict[str, Any]:
    return {"m": {"path": str(model_path), "ctx_len": 1024, "n_parallel": 2, "threads": 1, **kw}}


async def start(h: Harness, model_path: Path, *, groups: dict[str, str] | None = None, n_parallel: int = 2,
                **server: Any) -> dict[str, dict[str, str]]:
    """A server of model ``m`` with keys alice, bob and mallory (``groups``: their cache_group)."""
    path = h.tmp / "keys.toml"
    specs = {n: {"scopes": ["infer", "manage"], **({"cache_group": groups[n]} if groups and n in groups else {})}
             for n in ("alice", "bob", "mallory")}
    secrets = write_keys_file(path, **specs)
    await h.serve(models(model_path, n_parallel=n_parallel), worker_command=None, keys_file=str(path),
                  state_dir=str(h.tmp / "state"), **server)
    return {n: bearer(s) for n, s in secrets.items()}


def assert_reveals_nothing(seen: dict[str, int], n_prompt: int) -> None:
    assert len(set(seen.values())) == 1, f"the right guess stands out: {seen}"
    assert seen[SECRET] < n_prompt // 2, f"Mallory reused Alice's prompt: {seen} of {n_prompt}"


@pytest.mark.parametrize("dialect", ["completions", "chat", "messages", "responses"])
async def test_a_guessed_pin_reveals_nothing(harness: Harness, model_path: Path, dialect: str) -> None:
    """Alice keeps using her prompt (her slot holds it); between her requests Mallory guesses,
    each guess with a fresh ``cache_salt`` so that her own earlier guesses serve it nothing."""
    keys = await start(harness, model_path)
    seen, mine = {}, []
    for i, pin in enumerate(GUESSES):
        cached, n_prompt = await ask(harness, keys["alice"], SECRET, dialect)
        mine.append(cached)
        seen[pin] = (await ask(harness, keys["mallory"], pin, dialect, salt=f"guess-{i}"))[0]
    assert_reveals_nothing(seen, n_prompt)
    assert min(mine[1:]) > n_prompt // 2  # Alice's own prefix serves her all along


async def test_the_ram_cache_restores_no_other_tenants_prefix(harness: Harness, model_path: Path) -> None:
    keys = await start(harness, model_path, n_parallel=1)  # one slot: each guess overwrites the last
    _, n_prompt = await ask(harness, keys["alice"], SECRET)
    seen = await guesses(harness, keys["mallory"])  # Alice's prefix went to the RAM cache at the first
    assert_reveals_nothing(seen, n_prompt)
    again, _ = await ask(harness, keys["alice"], SECRET)
    assert again > n_prompt // 2  # restored from RAM, for Alice


async def test_a_cache_group_shares_and_no_one_else(harness: Harness, model_path: Path) -> None:
    keys = await start(harness, model_path, groups={"alice": "desk", "bob": "desk"})
    _, n_prompt = await ask(harness, keys["alice"], SECRET)
    bob, _ = await ask(harness, keys["bob"], SECRET)
    assert bob > n_prompt // 2  # one group, one cache: Alice's prompt serves Bob
    assert_reveals_nothing(await guesses(harness, keys["mallory"]), n_prompt)


async def test_another_cache_salt_of_the_same_key_does_not_share(harness: Harness, model_path: Path) -> None:
    keys = await start(harness, model_path)
    _, n_prompt = await ask(harness, keys["alice"], SECRET, salt="tab-1")
    other, _ = await ask(harness, keys["alice"], SECRET, salt="tab-2")
    none, _ = await ask(harness, keys["alice"], SECRET)
    same, _ = await ask(harness, keys["alice"], SECRET, salt="tab-1")
    assert other < n_prompt // 2 and none < n_prompt // 2
    assert same > n_prompt // 2  # the same salt, and only it, shares
    # Mallory with Alice's salt is still not Alice
    seen = {pin: (await ask(harness, keys["mallory"], pin, salt="tab-1"))[0] for pin in [WARM_UP, *GUESSES]}
    del seen[WARM_UP]
    assert_reveals_nothing(seen, n_prompt)


async def test_a_server_without_keys_shares_as_before(harness: Harness, model_path: Path) -> None:
    await harness.serve(models(model_path), worker_command=None, state_dir=str(harness.tmp / "s"))
    _, n_prompt = await ask(harness, {}, SECRET)
    again, _ = await ask(harness, {}, SECRET)
    assert again > n_prompt // 2


async def test_a_swap_restores_no_other_tenants_prefix_from_disk(harness: Harness, model_path: Path) -> None:
    keys = await start(harness, model_path)
    _, n_prompt = await ask(harness, keys["alice"], SECRET)
    r = await harness.client.post("/models/unload", json={"model": "m"}, headers=keys["alice"])
    assert r.status_code == 200, r.text  # the worker wrote Alice's prefix to disk as it stopped
    cached, _ = await ask(harness, keys["mallory"], SECRET)  # a fresh worker: only the disk holds it
    assert cached < n_prompt // 2, f"Mallory restored Alice's prefix from disk ({cached} of {n_prompt})"
    again, _ = await ask(harness, keys["alice"], SECRET)
    assert again > n_prompt // 2  # the file is there, and Alice's


async def test_a_restored_slot_file_serves_only_its_tenant(harness: Harness, model_path: Path) -> None:
    keys = await start(harness, model_path, prompt_cache_disk=0)
    c = harness.client
    _, n_prompt = await ask(harness, keys["alice"], SECRET)
    slot = await _alice_slot(c, keys["alice"])
    r = await c.post(f"/slots/{slot}?action=save", json={"filename": "desk.bin"}, headers=keys["alice"])
    assert r.status_code == 200, r.text
    r = await c.post("/models/unload", json={"model": "m"}, headers=keys["alice"])  # RAM cache gone too
    assert r.status_code == 200, r.text
    r = await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 1}, headers=keys["mallory"])
    assert r.status_code == 200, r.text  # m is loaded again: it has slots
    r = await c.post("/slots/0?action=restore", json={"filename": "desk.bin"}, headers=keys["mallory"])
    assert r.status_code == 200, r.text
    r = await c.post("/slots/1?action=restore", json={"filename": "desk.bin"}, headers=keys["mallory"])
    assert r.status_code == 200, r.text
    assert_reveals_nothing(await guesses(harness, keys["mallory"]), n_prompt)
    r = await c.post("/slots/0?action=restore", json={"filename": "desk.bin"}, headers=keys["alice"])
    assert r.status_code == 200, r.text
    again, _ = await ask(harness, keys["alice"], SECRET)
    assert again > n_prompt // 2  # the file's cells stay Alice's


async def _alice_slot(c: httpx.AsyncClient, who: dict[str, str]) -> int:
    """The slot whose cache holds the longest prompt (Alice's, the only one sent)."""
    r = await c.get("/slots?model=m", headers=who)
    assert r.status_code == 200, r.text
    slots = r.json()
    return max(range(len(slots)), key=lambda i: int(slots[i]["n_cached"]))


@pytest.mark.parametrize("url,body,shape", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "openai"),
    ("/v1/completions", {"prompt": "hi"}, "openai"),
    ("/v1/responses", {"input": "hi"}, "openai"),
    ("/infill", {"input_prefix": "def f(", "input_suffix": ")"}, "openai"),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}, "anthropic"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, "ollama"),
    ("/api/generate", {"prompt": "hi"}, "ollama"),
])
@pytest.mark.parametrize("salt", [7, ["a"], "", "x" * 257])
async def test_a_bad_cache_salt_is_a_400_in_the_dialects_shape(harness: Harness, url: str, body: dict[str, Any],
                                                               shape: str, salt: Any) -> None:
    await harness.serve({"m": {"path": str(harness.script("m"))}})
    r = await harness.client.post(url, json={"model": "m", **body, "cache_salt": salt})
    assert r.status_code == 400, r.text
    err = r.json()
    if shape == "openai":
        assert "cache_salt" in err["error"]["message"] and err["error"]["param"] == "cache_salt"
    elif shape == "anthropic":
        assert err["type"] == "error" and "cache_salt" in err["error"]["message"]
    else:
        assert "cache_salt" in err["error"]
    assert "Traceback" not in r.text and ".py" not in r.text
    assert harness.requests_seen("m") == []  # nothing reached a worker
