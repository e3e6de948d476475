"""Where corral says a model's parts went, next to what llama.cpp logged allocating.

One worker engine in process (``bench/probes/inproc.py``) per ``n_gpu_layers`` value; for each,
a table: every device of ``ModelInfo.placement`` (computed by corral: weights, KV,
compute estimate) and the buffers llama.cpp logged at the load (``ModelInfo.buffers``:
model, KV, compute). On a GPU it shows whether the layer split and the KV per device
are llama.cpp's; on a CPU there is one host row.

    python -m bench.probes.placement_check [--model M] [--gpu-layers 0,10,-1] [--ctx-len 8192] [--parallel 4]
"""

from __future__ import annotations

import argparse

from bench.probes.inproc import open_engine

MiB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--gpu-layers", default="0,10,-1")
    ap.add_argument("--ctx-len", type=int, default=8192)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--cache-type", default="f16")
    a = ap.parse_args()
    for ngl in (int(x) for x in a.gpu_layers.split(",")):
        e = open_engine(a.model, n_parallel=a.parallel, ctx_len=a.ctx_len, n_gpu_layers=ngl,
                        cache_type_k=a.cache_type, cache_type_v=a.cache_type)
        try:
            info = e.info
            print(f"\n#### n_gpu_layers {ngl}: {info.gpu_layers} offloaded, context {info.n_ctx} cells, "
                  f"KV {a.cache_type}")
            print("| device | layers (corral) | output | weights MiB (corral) | KV MiB (corral) | compute MiB (corral, "
                  "estimate) |")
            print("|---|---|---|---|---|---|")
            for p in info.placement:
                span = f"{p.first_layer}-{p.first_layer + p.layers - 1}" if p.layers else "-"
                print(f"| {p.device} | {span} | {'yes' if p.output else '-'} | {p.weight_bytes / MiB:.1f} | "
                      f"{p.kv_bytes / MiB:.2f} | {p.compute_bytes / MiB:.1f} |")
            print("\n| llama.cpp buffer | kind | MiB (logged) |")
            print("|---|---|---|")
            for b in info.buffers:
                print(f"| {b.buffer} | {b.kind} | {b.bytes / MiB:.2f} |")
        finally:
            e.close()


if __name__ == "__main__":
    main()
