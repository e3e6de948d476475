"""`make soak`: the reliability suite's long run, printing the counts.

    python tests/reliability/soak.py [--minutes 30] [--interval 30] [--streams 8]

With the real model, as two models in one router:
1. faults under load: ``--streams`` streaming clients per model for ``--minutes``, a
   SIGKILL to a worker of each model every ``--interval`` seconds;
2. a load/unload storm (50 concurrent calls, 3 rounds) while requests run;
3. 200 header dribblers: a normal request's median latency against idle (must stay
   within 2x: this is where that timing bound is checked, not in the test suite);
4. the router SIGKILLed 10 times: no worker left.
Exit status 1 if anything went wrong; the last line is the summary for architecture.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reliability.server import RouterProcess, alive, real_models, wait_until  # noqa: E402
from reliability.test_faults import run_faults  # noqa: E402
from reliability.test_slow_clients import dribble, timed_completion  # noqa: E402


async def storm(r: RouterProcess, model: str) -> tuple[dict[str, int], list[str]]:
    import httpx

    counts: dict[str, int] = {}
    bad: list[str] = []
    stop = asyncio.Event()

    def note(key: str, status: int, text: str) -> None:
        counts[f"{key} {status}"] = counts.get(f"{key} {status}", 0) + 1
        if status >= 500 or "Traceback" in text:
            bad.append(f"{key} {status} {text[:200]}")

    async def client() -> None:
        async with r.aclient(timeout=120) as c:
            while not stop.is_set():
                resp = await c.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 4})
                note("request", resp.status_code, resp.text)

    async def call(c: httpx.AsyncClient, i: int) -> None:
        path = "/models/load" if i % 2 == 0 else "/models/unload"
        resp = await c.post(path, json={"model": model})
        note(path, resp.status_code, resp.text)

    clients = [asyncio.create_task(client()) for _ in range(4)]
    async with r.aclient(timeout=180, limits=httpx.Limits(max_connections=50)) as c:
        for _ in range(3):
            await asyncio.gather(*(call(c, i) for i in range(50)))
    stop.set()
    await asyncio.gather(*clients)
    return counts, bad


async def dribblers(r: RouterProcess) -> float:
    await timed_completion(r, "a")
    idle = [await timed_completion(r, "a") for _ in range(7)]
    cut: list[float] = []
    connected = asyncio.Semaphore(0)
    tasks = [asyncio.create_task(dribble(r.port, cut, connected.release)) for _ in range(200)]
    for _ in tasks:  # every dribbler holds its connection before the busy round
        await asyncio.wait_for(connected.acquire(), 60)
    busy = [await timed_completion(r, "a") for _ in range(7)]
    await asyncio.gather(*tasks)
    return statistics.median(busy) / statistics.median(idle)


def router_kills(model_path: Path, tmp: Path, times: int = 10) -> int:
    orphans = 0
    for i in range(times):
        d = tmp / f"kill{i}"
        d.mkdir()
        r = RouterProcess(d, real_models(model_path, "a", "b", ctx_len=256, n_parallel=1, own_instances=True)).start()
        with r.client() as c:
            for m in ("a", "b"):
                c.post("/models/load", json={"model": m})
        pids = r.worker_pids()
        r.kill()
        try:
            wait_until(lambda: not [p for p in pids if alive(p)], 15, "workers to die")
        except AssertionError:
            orphans += len([p for p in pids if alive(p)])
    return orphans


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--streams", type=int, default=8)
    args = ap.parse_args()
    from corral.store.embedded import embedded_model_path

    model_path = embedded_model_path()
    failed = False
    with tempfile.TemporaryDirectory(prefix="corral-soak-") as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "main").mkdir()
        r = RouterProcess(tmp / "main", real_models(model_path, "a", "b", ctx_len=1024, n_parallel=8, own_instances=True),
                          header_timeout_s=3.0).start()
        try:
            kills = max(1, int(args.minutes * 60 // args.interval))
            t0 = time.monotonic()
            t = await run_faults(r, ["a", "b"], kills, args.interval, streams=args.streams)
            took = time.monotonic() - t0
            print(f"faults: {took / 60:.1f} min, 2 models x {args.streams} streams, {t.kills} worker kills, "
                  f"{t.comebacks} comebacks, stream ends {dict(t.ends)}, problems {len(t.problems)}")
            for p in t.problems[:10]:
                print("  problem:", p)
            failed |= bool(t.problems) or t.comebacks != t.kills
            counts, bad = await storm(r, "a")
            print(f"storm: {counts}, 5xx/tracebacks {len(bad)}")
            for b in bad[:5]:
                print("  problem:", b)
            failed |= bool(bad)
            ratio = await dribblers(r)
            print(f"slow clients: 200 header dribblers, normal request latency x{ratio:.2f} of idle")
            failed |= ratio > 2.0
            tb = r.router_log().count("Traceback")
            print(f"router log tracebacks: {tb}")
            failed |= tb > 0
        finally:
            r.stop()
        orphans = router_kills(model_path, tmp)
        print(f"router SIGKILL x10: {orphans} orphan workers")
        failed |= orphans > 0
    print(f"soak {'FAILED' if failed else 'passed'}: {t.kills} kills/{t.comebacks} comebacks over "
          f"{took / 60:.0f} min, {sum(t.ends.values())} streams {dict(t.ends)}, latency x{ratio:.2f}, "
          f"{orphans} orphans")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
