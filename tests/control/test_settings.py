"""One model-settings type: defaults in one place, unknown keys named, bounds shared."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from corral import wire
from corral.config.file import config_from_dict
from corral.control.catalog import ModelSpec
from corral.errors import ConfigError
from corral.model.settings import ModelSettings, SettingsError
from support.harness import Harness


def test_defaults_live_in_one_place() -> None:
    base = ModelSettings()
    assert ModelSpec(id="m", path=Path("/m")).settings() == base
    assert wire.WorkerSettings(model_id="m", model_path="/m").settings() == base
    assert config_from_dict({}).inherited_settings() == base


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(SettingsError) as ei:
        ModelSettings.check_partial({"n_paralel": 2})
    assert ei.value.errors[0][0] == "n_paralel"
    with pytest.raises(ConfigError, match=r"\[defaults\] key 'ctx_lenn': unknown key"):
        config_from_dict({"defaults": {"ctx_lenn": 5}}, name="t.toml")


def test_bounds_apply_to_config_and_worker_settings_alike() -> None:
    with pytest.raises(ConfigError, match=r"\[models.m\] key 'n_parallel'.*>= 1"):
        config_from_dict({"models": {"m": {"path": "/m", "n_parallel": 0}}}, name="t.toml")
    with pytest.raises(msgspec.ValidationError, match="n_parallel"):
        msgspec.json.decode(b'{"model_id": "m", "model_path": "/m", "n_parallel": 0}',
                            type=wire.WorkerSettings)


def test_worker_settings_carry_every_model_setting(tmp_path: Path) -> None:
    cfg = config_from_dict({"defaults": {"seed": 7, "flash_attn": True, "verbose": True},
                            "models": {"m": {"path": "/m.gguf", "threads_batch": 3}}})
    spec = ModelSpec.make("m", Path("/m.gguf"), cfg.model_settings("m"), source="config")
    ws = spec.worker_settings(0, threads=2)
    assert (ws.seed, ws.flash_attn, ws.verbose, ws.threads, ws.threads_batch) == (7, True, True, 2, 3)


async def test_nitro_loadmodel_checks_settings_by_its_own_names(harness: Harness) -> None:
    await harness.serve({}, allowed_model_dirs=[str(harness.tmp)])
    path = harness.script("n")
    r = await harness.client.post("/inferences/llamacpp/loadmodel",
                                  json={"model_id": "n", "llama_model_path": str(path), "n_parallel": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_parallel"
    r = await harness.client.post("/inferences/llamacpp/loadmodel",
                                  json={"model_id": "n", "llama_model_path": str(path), "ngl": -5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ngl"


def test_generation_defaults_are_checked_with_file_table_and_key() -> None:
    with pytest.raises(ConfigError, match=r"t.toml: \[models.m\] key 'temperature'.*<= 2"):
        config_from_dict({"models": {"m": {"path": "/m", "temperature": 3.0}}}, name="t.toml")
    with pytest.raises(ConfigError, match=r"t.toml: \[defaults\] key 'stop'"):
        config_from_dict({"defaults": {"stop": [""]}}, name="t.toml")
    with pytest.raises(ConfigError, match=r"\[defaults\] key 'top_k'"):
        config_from_dict({"defaults": {"top_k": "many"}}, name="t.toml")
    with pytest.raises(ConfigError, match=r"\[models.m\] key 'chat_template_kwargs'"):
        config_from_dict({"models": {"m": {"path": "/m", "chat_template_kwargs": "x"}}}, name="t.toml")
    cfg = config_from_dict({"defaults": {"top_k": 20}, "models": {"m": {"path": "/m", "temperature": 0.6}}})
    s = cfg.model_settings("m")
    assert (s.temperature, s.top_k, s.top_p) == (0.6, 20, None)


def test_a_generation_default_is_no_load_setting() -> None:
    """Changing one restarts no worker (the router adds them to each request)."""
    a = ModelSpec(id="m", path=Path("/m"))
    b = ModelSpec(id="m", path=Path("/m"), temperature=0.1, system="x", chat_template_kwargs={"k": 1},
                  seed=3, default_max_tokens=5)
    assert a.worker_key() == b.worker_key()
    assert a.worker_key() != ModelSpec(id="m", path=Path("/m"), n_parallel=2).worker_key()


def test_a_variant_differs_only_in_what_a_request_carries() -> None:
    """ModelSpec.load_key (control/plane.py's serving): generation defaults, the plain
    prompt and adapter scales a request carries; the file, context and adapters a load fixes."""
    from corral.model.settings import LoraAdapter

    a = ModelSpec(id="a", path=Path("/m"), pre_prompt="A", lora=[LoraAdapter(id="x", path="/x.gguf", scale=1.0)])
    b = ModelSpec(id="b", path=Path("/m"), pre_prompt="B", temperature=0.1, system="s",
                  lora=[LoraAdapter(id="x", path="/x.gguf", scale=0.25)])
    assert a.load_key() == b.load_key()
    assert a.worker_key() != b.worker_key()  # its own instances would still restart for a new pre_prompt
    for other in (ModelSpec(id="c", path=Path("/other"), pre_prompt="A"),
                  ModelSpec(id="c", path=Path("/m"), ctx_len=4096, lora=a.lora),
                  ModelSpec(id="c", path=Path("/m"), lora=[LoraAdapter(id="x", path="/y.gguf")])):
        assert other.load_key() != a.load_key()
