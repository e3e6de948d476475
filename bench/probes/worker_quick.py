"""Quick throughput check of ONE worker process, driven directly over its socket.

    .venv/bin/python -m bench.probes.worker_quick [--threads 2] [--levels 1,8] [--requests-per-client 4]

c closed-loop clients: each keeps one request in flight (64 tokens, ignore_eos,
temperature 0) and sends the next as soon as its Finished arrives. Prints aggregate
generated tokens per second per concurrency level. The worker gets n_parallel = max level.
Not a substitute for the bench engineer's comparison against llama-server.
"""

from __future__ import annotations

import argparse
import time

from corral import wire
from corral.control.transport.local import LocalSpawner

from bench.servers import LOGS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="1,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--ctx-len", type=int, default=4096)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    if args.model is None:
        from corral.store.embedded import embedded_model_path

        args.model = str(embedded_model_path())
    settings = wire.WorkerSettings(
        model_id="bench", model_path=args.model, threads=args.threads,
        n_parallel=max(levels), ctx_len=args.ctx_len,
    )
    # started as the router starts one; its output stays on this terminal
    proc, parent = LocalSpawner(LOGS).spawn_process(settings, stdout=None, stderr=None)
    dec = wire.FrameDecoder()

    def recv_all() -> list[wire.FromWorker]:
        data = parent.recv(1 << 16)
        if not data:
            raise SystemExit("worker exited")
        return [wire.decode_from_worker(b) for b in dec.feed(data)]

    ready = False
    while not ready:
        for m in recv_all():
            if isinstance(m, wire.LoadFailed):
                raise SystemExit(f"load failed: {m.reason}")
            ready = isinstance(m, wire.Ready)
    params = wire.SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0.0)
    prompts = [f"Write a story about the number {i}." for i in range(1000)]
    n = 0

    def send() -> None:
        nonlocal n
        parent.sendall(wire.encode(wire.GenerateRequest(id=f"b{n}", prompt=prompts[n % 1000], params=params)))
        n += 1

    # warm-up
    send()
    while not any(isinstance(m, wire.Finished) for m in recv_all()):
        pass
    for c in levels:
        total = c * args.requests_per_client
        sent = done = tokens = 0
        t0 = time.perf_counter()
        for _ in range(c):
            send()
            sent += 1
        while done < total:
            for m in recv_all():
                if isinstance(m, wire.Finished):
                    done += 1
                    tokens += m.usage.completion_tokens
                    if sent < total:
                        send()
                        sent += 1
                elif isinstance(m, wire.RequestFailed):
                    raise SystemExit(f"request failed: {m}")
        dt = time.perf_counter() - t0
        print(f"c={c}: {tokens} tokens in {dt:.2f}s = {tokens / dt:.1f} tok/s aggregate")
    parent.close()
    proc.wait(30)


if __name__ == "__main__":
    main()
