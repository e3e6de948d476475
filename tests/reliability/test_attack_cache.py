"""Issue 33's first attack, replayed with real workers and the real model: a key guesses another
key's secret through the shared prefix cache, reading the cached-token counter every dialect
reports. With cache isolation by tenant every guess reports the same count, the right one too,
in a slot, after an unload (the disk cache) and through the Anthropic dialect; keys of one
``cache_group`` share on purpose; a ``cache_salt`` splits one key's cache further.

Each test fails without the tenant match (a shared cache: the right guess reuses the whole
prompt, the wrong ones stop at the PIN)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from support.harness import Harness
from support.keys import bearer, write_keys_file

pytestmark = pytest.mark.integration

HEAD = " ".join(f"Rule {i}: the {('red', 'blue', 'green')[i % 3]} stone goes to box {i % 5}." for i in range(6))
TAIL = " ".join(f"Note {i}: keep the {('north', 'south')[i % 2]} door shut after {i} pm." for i in range(14))
PIN = "4817"


def prompt(pin: str) -> str:
    return f"{HEAD} The vault PIN is {pin}. {TAIL}"


def models(model_path: Path) -> dict[str, Any]:
    return {"m": {"path": str(model_path), "ctx_len": 2048, "n_parallel": 2, "threads": 1}}


async def _start(harness: Harness, model_path: Path, tmp: Path, **keys: dict[str, Any]) -> dict[str, str]:
    path = tmp / "keys.toml"
    secrets = write_keys_file(path, **keys)
    await harness.start(harness.config(models(model_path), worker_command=None, keys_file=str(path),
                                       state_dir=str(tmp / "state")))
    return secrets


async def cached(harness: Harness, secret: str, text: str, **extra: Any) -> tuple[int, int]:
    r = await harness.client.post("/v1/completions", headers=bearer(secret),
                                  json={"model": "m", "prompt": text, "max_tokens": 1, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]


async def guesses(harness: Harness, secret: str, pins: list[str]) -> list[int]:
    await cached(harness, secret, prompt("0000"))  # the attacker's own prefix, warm
    return [(await cached(harness, secret, prompt(p)))[1] for p in pins]


async def test_guessing_another_keys_pin_reveals_nothing(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    secrets = await _start(harness, model_path, tmp_path, alice={}, mallory={})
    n_prompt, _ = await cached(harness, secrets["alice"], prompt(PIN))
    counts = await guesses(harness, secrets["mallory"], ["1111", PIN, "9020"])
    assert len(set(counts)) == 1, counts  # the right guess looks like the wrong ones
    assert counts[0] < n_prompt // 2, (counts, n_prompt)  # only mallory's own prefix, up to the PIN
    assert (await cached(harness, secrets["alice"], prompt(PIN)))[1] == n_prompt - 1  # alice keeps hers



async def test_a_restored_prefix_is_its_tenants_only(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    secrets = await _start(harness, model_path, tmp_path, alice={}, mallory={}, admin={"scopes": ["infer", "manage"]})
    n_prompt, _ = await cached(harness, secrets["alice"], prompt(PIN))
    r = await harness.client.post("/models/unload", headers=bearer(secrets["admin"]), json={"model": "m"})
    assert r.status_code == 200, r.text  # alice's prefix goes to the disk cache
    assert list((tmp_path / "state" / "prompt-cache").rglob("*.kv"))
    counts = await guesses(harness, secrets["mallory"], ["1111", PIN, "9020"])  # a new worker
    assert len(set(counts)) == 1, counts
    assert (await cached(harness, secrets["alice"], prompt(PIN)))[1] == n_prompt - 1  # restored for alice


async def test_the_anthropic_counter_reveals_nothing(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    secrets = await _start(harness, model_path, tmp_path, alice={}, mallory={})

    async def read(secret: str, pin: str) -> int:
        r = await harness.client.post("/v1/messages", headers={"x-api-key": secret}, json={
            "model": "m", "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": prompt(pin)}]})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["cache_read_input_tokens"])

    await read(secrets["alice"], PIN)
    await read(secrets["mallory"], "0000")
    counts = [await read(secrets["mallory"], p) for p in ("1111", PIN, "9020")]
    assert len(set(counts)) == 1, counts


async def test_a_cache_group_shares_and_a_salt_splits(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    secrets = await _start(harness, model_path, tmp_path, bob={"cache_group": "team-a"},
                           carol={"cache_group": "team-a"}, dave={})
    n_prompt, _ = await cached(harness, secrets["bob"], prompt(PIN))
    assert (await cached(harness, secrets["carol"], prompt(PIN)))[1] == n_prompt - 1  # the group shares
    assert (await cached(harness, secrets["dave"], prompt(PIN)))[1] < n_prompt // 2  # outside it: not

    n_salted, first = await cached(harness, secrets["dave"], prompt("2222"), cache_salt="s1")
    assert first < n_salted // 2  # dave's unsalted entry is another tenant
    assert (await cached(harness, secrets["dave"], prompt("2222"), cache_salt="s1"))[1] == n_salted - 1
    assert (await cached(harness, secrets["dave"], prompt("2222"), cache_salt="s2"))[1] < n_salted // 2


async def test_a_bad_cache_salt_is_a_400(harness: Harness, model_path: Path, tmp_path: Path) -> None:
    secrets = await _start(harness, model_path, tmp_path, alice={})
    for salt in (7, "", "x" * 257):
        r = await harness.client.post("/v1/completions", headers=bearer(secrets["alice"]),
                                      json={"model": "m", "prompt": "Hi", "max_tokens": 1, "cache_salt": salt})
        assert r.status_code == 400 and "cache_salt" in r.text, (salt, r.text)
