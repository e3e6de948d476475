"""The GPU test group: real workers on a real ggml GPU backend, the embedded model.

The workers run on llama-cpp-python's GPU build beside the CPU one the rest of the suite
uses (``make vulkan``: bench/gpu/install_backend.sh): its ``env.sh`` (``LLAMA_CPP_LIB_PATH``,
and here Mesa's lavapipe: ``VK_ICD_FILENAMES``, ``GGML_VK_VISIBLE_DEVICES=0``, the shader
cache) is put into this process's environment for the group, so the workers it starts
inherit it; this process (the router) never loads llama.cpp.

``CORRAL_GPU_BACKEND`` picks the backend (``vulkan``, the default; ``cuda``: bench/gpu/run.sh),
``CORRAL_GPU_ENV`` the env.sh (default: ``llama-cpp-BACKEND/env.sh`` in this venv; empty:
the environment already runs workers on the GPU build), ``CORRAL_GPU_MODEL`` the model (default:
the embedded Gemma 3 270M; on a GPU machine without it, bench/gpu/run.sh's generated one). No build
is an error, not a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.fixtures import harness  # noqa: F401 - the fixture, shared

BACKEND = os.environ.get("CORRAL_GPU_BACKEND", "vulkan")
DEVICE = {"vulkan": "Vulkan", "cuda": "CUDA"}[BACKEND]  # llama.cpp's device names: Vulkan0, CUDA0


def _backend_env() -> dict[str, str]:
    """The variables env.sh sets or changes."""
    path = os.environ.get("CORRAL_GPU_ENV", str(Path(sys.prefix) / f"llama-cpp-{BACKEND}" / "env.sh"))
    if not path:
        return {}
    if not Path(path).is_file():
        pytest.fail(f"no {BACKEND} build of llama-cpp-python ({path} is missing): run `make {BACKEND}` first "
                    "(`make test` does)", pytrace=False)
    out = subprocess.run(["bash", "-c", '. "$0" && env -0', path], capture_output=True, check=True).stdout
    after = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    return {k: v for k, v in after.items() if os.environ.get(k) != v and k not in ("_", "SHLVL", "PWD", "OLDPWD")}


@pytest.fixture(scope="session")
def model_path() -> Path:
    given = os.environ.get("CORRAL_GPU_MODEL")
    if given:
        return Path(given)
    from corral.store.embedded import embedded_model_path

    return embedded_model_path()


@pytest.fixture(autouse=True, scope="package")
def _gpu_backend() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in _backend_env().items():
            mp.setenv(k, v)
        yield
