"""A storm of management calls on one model while requests run (real router, real model).

50 concurrent calls, alternating load and unload, three rounds, with 4 clients sending
completions all along. Asserted: no 5xx anywhere (a request that meets an unload may
get a 4xx only if it says why), no traceback, nothing stuck once quiet (the model is
loaded or unloaded, every instance ready or stopped), no orphan worker process.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

import httpx
import pytest

from reliability.server import RouterProcess, alive, real_models, wait_until

pytestmark = pytest.mark.integration

CALLS = 50
ROUNDS = 3


def worker_children(router_pid: int) -> set[int]:
    """Live processes whose parent is the router and that run corral.worker."""
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[1]) == router_pid and b"corral.worker" in cmd and alive(int(d)):
            out.add(int(d))
    return out


def settled(r: RouterProcess) -> dict:
    with r.client() as c:
        m = next(x for x in c.get("/models").json()["data"] if x["id"] == "m")
    return m


def check_quiet(r: RouterProcess) -> str:
    def quiet() -> bool:
        m = settled(r)
        return m["status"]["value"] in ("loaded", "unloaded") and all(
            i["state"] in ("ready", "stopped") for i in m["instances"])
    wait_until(quiet, 120, "the model to settle")
    m = settled(r)
    assert r.proc is not None
    live = {i["pid"] for i in m["instances"] if i["state"] == "ready"}
    wait_until(lambda: worker_children(r.proc.pid) == live, 30,  # type: ignore[union-attr]
               f"worker processes to be exactly the ready instances {live}")
    return str(m["status"]["value"])


async def test_load_unload_storm_while_requests_run(routers, model_path: Path) -> None:  # noqa: ANN001
    r = routers(real_models(model_path, "m", ctx_len=512, n_parallel=2, instances=2))
    statuses: Counter[str] = Counter()
    bad: list[str] = []
    stop = asyncio.Event()

    async def client() -> None:
        async with r.aclient(timeout=120) as c:
            while not stop.is_set():
                resp = await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 4})
                statuses[f"req {resp.status_code}"] += 1
                if resp.status_code >= 500 or "Traceback" in resp.text:
                    bad.append(f"request {resp.status_code} {resp.text[:300]}")

    async def call(c: httpx.AsyncClient, i: int) -> None:
        path = "/models/load" if i % 2 == 0 else "/models/unload"
        resp = await c.post(path, json={"model": "m"})
        statuses[f"{path} {resp.status_code}"] += 1
        if resp.status_code >= 500 or "Traceback" in resp.text:
            bad.append(f"{path} {resp.status_code} {resp.text[:300]}")

    clients = [asyncio.create_task(client()) for _ in range(4)]
    async with r.aclient(timeout=180, limits=httpx.Limits(max_connections=CALLS)) as c:
        for _ in range(ROUNDS):
            await asyncio.gather(*(call(c, i) for i in range(CALLS)))
    stop.set()
    await asyncio.wait_for(asyncio.gather(*clients), 180)
    print(f"\nstorm: {dict(sorted(statuses.items()))}")
    print("\n".join(sorted(set(b[:200] for b in bad))))
    assert not bad, bad[:5]
    assert "Traceback" not in r.router_log()
    final = check_quiet(r)
    async with r.aclient() as c:  # and it still serves
        resp = await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 2})
        assert resp.status_code == 200, (final, resp.text)
    check_quiet(r)
