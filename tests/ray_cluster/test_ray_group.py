"""Runs the Ray test group (``tests/ray_cluster/test_cluster_*.py``) in a network namespace that
has only ``lo``, so that nothing Ray does can leave this machine."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


@pytest.mark.timeout(900)
def test_ray_group_in_loopback_only_namespace() -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'corral[ray]'); the Ray tests did not run")
    if os.geteuid() != 0:
        pytest.skip("the Ray tests need root: they run in a network namespace with only lo "
                    "(unshare -n), because Ray sends traffic beyond loopback by itself; "
                    "run `make test` as root (CI does) to run them")
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` is missing: the Ray tests need unshare and ip (util-linux, iproute2)")
    inner = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", str(HERE)]
    script = 'ip link set lo up && exec "$@"'
    proc = subprocess.run(["unshare", "-n", "--", "sh", "-c", script, "sh", *inner], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=880)
    print(proc.stdout)
    assert proc.returncode == 0, f"the Ray test group failed (rc {proc.returncode}):\n{proc.stdout[-6000:]}"
