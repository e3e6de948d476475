"""M-RoPE vision check: corral's worker against llama-server ``--mmproj`` on a Qwen2-VL pair.

    .venv/bin/python -m bench.checks.vision_mrope      # ~80 s on 2 cores

The files, written offline (testkit/gguf_qwen2vl.py; random weights: the words mean
nothing, every step is real): a tiny ``qwen2vl`` text model with a ``qwen2vl_merger``
(Qwen2-VL) and with a ``qwen2.5vl_merger`` (Qwen2.5-VL: windowed attention) projector, and a
tiny ``qwen3vl`` text model with a ``qwen3vl_merger`` (Qwen3-VL: deepstack features, image
embeddings twice the text width).
Their images take 2-D positions (t/y/x) and advance the text after them by max(nx, ny), not
by their token count, so a position slip anywhere changes the tokens. Each case is sent to
both, greedy, ``ignore_eos``; the token ids must be the same:

- one image (8 x 6 tokens), text before and after;
- the next turn: that prompt with more text after it, on a warm cache (both reuse the image's
  cells and cut their KV after the common prefix);
- two images of other shapes (a tall one) in one prompt;
- a big image (28 x 20 = 560 tokens: two pieces of n_batch 512; Qwen2.5-VL: 7 x 5 windows).

corral is driven at its worker (bench/checks/vision.py's ``Worker``), llama-server over HTTP.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import tempfile
from pathlib import Path

import httpx

from bench.checks import vision
from bench.checks.editors import THREADS, Proc, _free_port
from bench.llama_server import buffer_args, find as find_llama_server
from corral import wire

M = wire.MEDIA_MARKER
N_GEN = 24
CASES: list[tuple[str, str, list[tuple[int, tuple[int, int]]]]] = [
    ("one image", f"the picture {M} caption: the", [(1, (64, 48))]),
    ("next turn, cache warm", f"the picture {M} caption: the sky is red and the sea", [(1, (64, 48))]),
    ("two images, a tall one", f"one {M} and two {M} what is left:", [(2, (64, 48)), (3, (40, 72))]),
    ("a big image (2 pieces)", f"look {M} now:", [(4, (224, 160))]),
    ("an image of whole windows (12 x 8)", f"see {M} it is", [(5, (96, 64))]),
]


def picture(seed: int, size: tuple[int, int]) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def ls_tokens(c: httpx.Client, url: str, prompt: str, imgs: list[bytes]) -> tuple[list[int], str, int]:
    body = {"prompt": {"prompt_string": prompt, "multimodal_data": [base64.b64encode(i).decode() for i in imgs]},
            "n_predict": N_GEN, "temperature": 0, "ignore_eos": True, "cache_prompt": True, "return_tokens": True,
            "id_slot": 0}
    r = c.post(url + "/completion", json=body)
    r.raise_for_status()
    d = r.json()
    return d["tokens"], d["content"], d["timings"].get("cache_n", 0)


def run_llama_server(model: Path, mmproj: Path, cases: list[tuple[str, list[bytes]]]) -> list[tuple[list[int], str, int]]:
    exe = find_llama_server()
    if exe is None:
        raise SystemExit("no llama-server (python -m bench.llama_server builds it)")
    port = _free_port()
    os.environ["LLAMA_MEDIA_MARKER"] = M
    p = Proc("llama-server-mrope", [str(exe), "-m", str(model), "--mmproj", str(mmproj), "--host", "127.0.0.1",
                                    "--port", str(port), "-np", "1", "-c", str(vision.CTX), "-b", str(vision.N_BATCH),
                                    "-ub", str(vision.N_BATCH), "-t", str(THREADS), "-tb", str(THREADS), "-ngl", "0",
                                    *buffer_args()],
             port, "/health")
    try:
        p.wait()
        with httpx.Client(timeout=300) as c:
            return [ls_tokens(c, p.url, prompt, imgs) for prompt, imgs in cases]
    finally:
        p.stop()


def run_corral(model: Path, mmproj: Path, cases: list[tuple[str, list[bytes]]]) -> list[tuple[list[int], str, int]]:
    w = vision.Worker(model, mmproj)
    out = []
    try:
        for i, (prompt, imgs) in enumerate(cases):
            req = wire.GenerateRequest(id=f"m{i}", prompt=prompt, images=imgs, logprobs=0,
                                       params=wire.SamplingParams(max_tokens=N_GEN, temperature=0.0, ignore_eos=True))
            q = w._queue(req.id)
            w.sock.sendall(wire.encode(req))
            ids: list[int] = []
            text = ""
            while True:
                _, msg = q.get(timeout=300)
                if isinstance(msg, wire.Delta):
                    text += msg.text
                    ids += [lp.id for lp in msg.logprobs or []]
                elif isinstance(msg, wire.Finished):
                    out.append((ids, text, msg.usage.cached_tokens))
                    break
                else:
                    raise RuntimeError(f"corral failed {req.id}: {msg}")
    finally:
        w.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    from testkit.gguf_qwen2vl import write_qwen2vl_mmproj, write_qwen2vl_model

    d = Path(tempfile.mkdtemp(prefix="corral-mrope-"))
    qwen2 = write_qwen2vl_model(d / "qwen2vl.gguf")
    qwen3 = write_qwen2vl_model(d / "qwen3vl.gguf", arch="qwen3vl")
    cases = [(prompt, [picture(seed, size) for seed, size in imgs]) for _, prompt, imgs in CASES]
    print(f"tiny text models with each projector (random weights); {N_GEN} greedy tokens, ignore_eos; "
          f"n_batch {vision.N_BATCH}, {THREADS} threads")
    print("| pair | case | llama-server tokens (cached) | corral tokens (cached) | same |\n|---|---|---|---|---|")
    ok = True
    for version, model, kind in (("2", qwen2, "qwen2vl + qwen2vl_merger"), ("2.5", qwen2, "qwen2vl + qwen2.5vl_merger"),
                                 ("3", qwen3, "qwen3vl + qwen3vl_merger")):
        mmproj = write_qwen2vl_mmproj(d / f"mmproj-qwen{version}vl.gguf", version=version)
        print(f"{kind}: llama-server ...", file=sys.stderr, flush=True)
        ls = run_llama_server(model, mmproj, cases)
        print(f"{kind}: corral ...", file=sys.stderr, flush=True)
        co = run_corral(model, mmproj, cases)
        for (name, _, _), (lt, _, lc), (ct, _, cc) in zip(CASES, ls, co):
            same = lt == ct and len(ct) == N_GEN
            ok &= same
            print(f"| {kind} | {name} | {lt[:6]}... ({lc}) | {ct[:6]}... ({cc}) | {'same' if same else 'DIFFERENT'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
