"""Memory of a worker with the default slot context (``ctx_len`` unset: 32,768 cells a slot).

    .venv/bin/python -m bench.probes.default_context [--ctx-len 0] [--n-parallel 4] [--prompt-tokens 8000]

Starts ONE worker as the router does (the embedded model unless ``--model``), prints what
its ``Ready`` reports (context, KV bytes, RSS after load), then fills every slot with a
prompt of ``--prompt-tokens`` tokens at once (2 generated tokens each) and prints the RSS
again (``Stats``): KV pages are only resident once written. ``--ctx-len 4096``: the old default.
"""

from __future__ import annotations

import argparse
import time

from corral import wire
from corral.control.transport.local import LocalSpawner

from bench.servers import LOGS

MiB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-parallel", type=int, default=4)
    ap.add_argument("--ctx-len", type=int, default=0, help="0: unset (the default)")
    ap.add_argument("--prompt-tokens", type=int, default=8000)
    args = ap.parse_args()
    if args.model is None:
        from corral.store.embedded import embedded_model_path

        args.model = str(embedded_model_path())
    settings = wire.WorkerSettings(model_id="bench", model_path=args.model, threads=args.threads,
                                   n_parallel=args.n_parallel, ctx_len=args.ctx_len)
    proc, parent = LocalSpawner(LOGS).spawn_process(settings, stdout=None, stderr=None)
    dec = wire.FrameDecoder()

    def recv_all() -> list[wire.FromWorker]:
        data = parent.recv(1 << 16)
        if not data:
            raise SystemExit("worker exited")
        return [wire.decode_from_worker(b) for b in dec.feed(data)]

    t0 = time.perf_counter()
    info: wire.ModelInfo | None = None
    while info is None:
        for m in recv_all():
            if isinstance(m, wire.LoadFailed):
                raise SystemExit(f"load failed: {m.reason}")
            if isinstance(m, wire.Ready):
                info = m.info
    print(f"asked ctx_len {settings.ctx_len} ({settings.ctx_len // settings.n_parallel} a slot); loaded in "
          f"{time.perf_counter() - t0:.1f} s: n_ctx {info.n_ctx}, n_ctx_slot {info.n_ctx_slot}, "
          f"model {info.model_bytes / MiB:.0f} MiB, KV+compute {info.kv_bytes / MiB:.0f} MiB, "
          f"RSS at load {info.rss_bytes / MiB:.0f} MiB")
    n = min(args.prompt_tokens, info.n_ctx_slot - 8)
    prompt = " ".join(["word"] * n)  # about one token a word, and a space
    params = wire.SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0)
    t0 = time.perf_counter()
    for i in range(settings.n_parallel):
        parent.sendall(wire.encode(wire.GenerateRequest(id=f"p{i}", prompt=f"{i} {prompt}", params=params)))
    done = 0
    prompt_tokens = 0
    while done < settings.n_parallel:
        for m in recv_all():
            if isinstance(m, wire.Finished):
                done += 1
                prompt_tokens += m.usage.prompt_tokens
            elif isinstance(m, wire.RequestFailed):
                raise SystemExit(f"request failed: {m}")
    parent.sendall(wire.encode(wire.StatsRequest()))
    stats = None
    while stats is None:
        stats = next((m for m in recv_all() if isinstance(m, wire.Stats)), None)
    print(f"{settings.n_parallel} prompts, {prompt_tokens} tokens in all, in {time.perf_counter() - t0:.1f} s: "
          f"RSS {stats.rss_bytes / MiB:.0f} MiB")
    parent.sendall(wire.encode(wire.Shutdown()))
    proc.wait(30)


if __name__ == "__main__":
    main()
