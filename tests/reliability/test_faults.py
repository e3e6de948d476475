"""Faults under load (real router, real model): workers killed with SIGKILL while 8
streams run, and the router itself killed with SIGKILL.

In ``make test`` the worker-kill run is shortened (issue 8 asks for 3 minutes with a
kill every 30 s; that full run is ``make soak``, which also runs two models for 30
minutes): ``FAULT_KILLS`` kills every ``FAULT_INTERVAL_S`` seconds (defaults 3 and
10 s: a 40 s run; each interval holds a worker restart and several rounds of 8 streams). Asserted: no hung request, every stream ends with ``[DONE]`` or an
error event (none silently cut), the model comes back after each kill, no traceback;
and a SIGKILLed router leaves no worker behind, ten times over.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from reliability.server import RouterProcess, alive, real_models, wait_until

pytestmark = pytest.mark.integration

FAULT_KILLS = int(os.environ.get("CORRAL_FAULT_KILLS", "3"))
FAULT_INTERVAL_S = float(os.environ.get("CORRAL_FAULT_INTERVAL_S", "10"))
STREAMS = 8


@dataclass
class Tally:
    ends: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    kills: int = 0
    comebacks: int = 0
    served: dict[str, asyncio.Event] = field(default_factory=dict)  # a stream of the model ended [DONE]


async def one_stream(c: httpx.AsyncClient, model: str, t: Tally) -> None:
    body = {"model": model, "prompt": "Tell me a long story.", "max_tokens": 48, "ignore_eos": True,
            "stream": True, "temperature": 0.7}
    last = None
    try:
        async with c.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                t.ends[f"http {resp.status_code}"] += 1
                if resp.status_code >= 500 and resp.status_code not in (502, 503):
                    t.problems.append(f"{resp.status_code} {text[:200]}")
                if "Traceback" in text:
                    t.problems.append(text[:300])
                if resp.status_code == 503:  # as a client should: wait as told (at most 1 s)
                    await asyncio.sleep(min(1.0, float(resp.headers.get("retry-after", "1"))))
                return
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    last = line[6:]
    except httpx.TimeoutException:
        t.problems.append("a request hung (no answer within the client timeout)")
        return
    except httpx.HTTPError as exc:
        t.problems.append(f"stream cut at the transport: {type(exc).__name__}: {exc}")
        return
    if last == "[DONE]":
        t.ends["done"] += 1
        t.served.setdefault(model, asyncio.Event()).set()
    elif last is not None and "error" in json.loads(last):
        t.ends["error event " + str(json.loads(last)["error"].get("code"))] += 1
    else:
        t.problems.append(f"stream ended without [DONE] or an error event (last: {last!r})")


async def ready_pid(r: RouterProcess, model: str) -> int | None:
    async with r.aclient() as c:
        data = (await c.get("/models")).json()["data"]
    for m in data:
        if m["id"] == model:
            for i in m["instances"]:
                if i["state"] == "ready" and i.get("pid"):
                    return int(i["pid"])
    return None


async def run_faults(r: RouterProcess, models: list[str], kills: int, interval_s: float,
                     streams: int = STREAMS) -> Tally:
    """``streams`` clients per model stream for the whole run; every ``interval_s`` one
    worker of each model gets SIGKILL; after each kill the model must come back."""
    t = Tally()
    stop = asyncio.Event()

    async def client(model: str) -> None:
        async with r.aclient(timeout=httpx.Timeout(120, connect=10)) as c:
            while not stop.is_set():
                await one_stream(c, model, t)

    async def killer(model: str) -> None:
        for _ in range(kills):
            await asyncio.sleep(interval_s)  # the fault schedule itself
            pid = await ready_pid(r, model)
            if pid is None:
                t.problems.append(f"{model} was not back when the next kill came")
                continue
            os.kill(pid, signal.SIGKILL)
            t.kills += 1
            deadline = time.monotonic() + max(60.0, interval_s)
            while True:
                new = await ready_pid(r, model)
                if new is not None and new != pid:
                    t.comebacks += 1
                    break
                if time.monotonic() > deadline:
                    t.problems.append(f"{model} did not come back after kill {t.kills}")
                    break
                await asyncio.sleep(0.2)  # polling another process's state

    async with r.aclient() as c:
        for m in models:
            assert (await c.post("/models/load", json={"model": m})).status_code == 200
    clients = [asyncio.create_task(client(m)) for m in models for _ in range(streams)]
    await asyncio.gather(*(killer(m) for m in models))
    for m in models:  # each model serves a whole stream again after its last kill
        event = t.served[m] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), 120)
        except TimeoutError:
            t.problems.append(f"{m} served no whole stream after the last kill")
    stop.set()
    await asyncio.wait_for(asyncio.gather(*clients), 300)
    return t


async def test_worker_sigkill_under_streaming_load(routers, model_path: Path) -> None:  # noqa: ANN001
    r = routers(real_models(model_path, "m", ctx_len=1024, n_parallel=8))
    t = await run_faults(r, ["m"], FAULT_KILLS, FAULT_INTERVAL_S)
    print(f"\nfaults: {t.kills} kills, {t.comebacks} comebacks, stream ends {dict(t.ends)}")
    assert not t.problems, t.problems[:5]
    assert t.kills == FAULT_KILLS and t.comebacks == FAULT_KILLS
    assert t.ends["done"] > 0 and any(k.startswith("error event") for k in t.ends)
    assert "Traceback" not in r.router_log()
    async with r.aclient() as c:
        resp = await c.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 2})
        assert resp.status_code == 200


def test_router_sigkill_leaves_no_worker(routers, model_path: Path) -> None:  # noqa: ANN001
    models = real_models(model_path, "a", "b", ctx_len=256, n_parallel=1, own_instances=True)
    for i in range(10):
        r = routers(models, sub=f"kill{i}-")
        with r.client() as c:
            for m in ("a", "b") if i % 2 == 0 else ("a",):
                assert c.post("/models/load", json={"model": m}).status_code == 200
        pids = r.worker_pids()
        assert pids and all(alive(p) for p in pids)
        r.kill()
        wait_until(lambda: not [p for p in pids if alive(p)], 15, f"workers {pids} to die with the router")
