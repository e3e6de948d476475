"""Ray is optional: without ray_address nothing imports it; the settings that name it
are validated like every other setting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from corral.config.file import config_from_dict
from corral.errors import ConfigError


def test_the_router_never_imports_ray_without_ray_address() -> None:
    code = ("import sys, asyncio\n"
            "from corral.api.app import create_app\n"
            "from corral.cli.main import app\n"
            "from corral.config.file import config_from_dict\n"
            "from corral.control.plane import ControlPlane\n"
            "async def main():\n"
            "    p = ControlPlane(config_from_dict({'server': {'include_default_model': False}}))\n"
            "    await p.start(); await p.close()\n"
            "asyncio.run(main())\n"
            "print('ray' in sys.modules, 'corral.control.transport.ray.cluster' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_ray_settings_are_validated(model_path: Path) -> None:
    cfg = config_from_dict({"server": {"ray_address": "127.0.0.1:6379", "ray_namespace": "team"},
                            "models": {"m": {"path": str(model_path), "ray_resources": {"gpu_box": 1}}}},
                           name="c.toml")
    assert cfg.server.ray_address == "127.0.0.1:6379" and cfg.server.ray_namespace == "team"
    with pytest.raises(ConfigError, match="ray_resources"):
        config_from_dict({"models": {"m": {"path": str(model_path), "ray_resources": {"gpu_box": -1}}}},
                         name="c.toml")
    with pytest.raises(ConfigError, match="ray_adress"):
        config_from_dict({"server": {"ray_adress": "auto"}}, name="c.toml")
