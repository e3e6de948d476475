"""The agent turn (issue 35): Claude Code's next session reuses the last one's prompt.

    .venv/bin/python -m bench.checks.agent_turn [--json OUT]

(about 4 minutes on 2 shared cores: one full prefill of 19k tokens)

corral with the embedded Gemma 3 (one slot of 32,768 cells, ``swa_full``, 2 threads) gets
Claude Code's recorded requests (tests/fixtures/clients/claude_code/, as Claude Code 2.1.197
sent them; ``max_tokens`` 1): the first session's first request (a cold slot: the full
prefill), then a second session's first request, whose attribution line differs
(``x-anthropic-billing-header``, left out of the prompt the model sees) and whose user
words differ. Each is timed from the request to its first token (the first
``content_block_delta``, or the ``message_delta`` of an empty answer).

Check: the second session's first token comes >= 20x sooner than the full prefill's, and
its ``cache_read_input_tokens`` is >= 98% of its prompt.

Exit status 0 when every check passes, 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.checks.editors import ROOT, corral

FIXTURES = ROOT / "tests" / "fixtures" / "clients" / "claude_code"
GOAL = 20.0
_DROP = {"host", "content-length", "connection", "accept-encoding"}


def first_token(c: httpx.Client, url: str, name: str) -> dict[str, Any]:
    """Send a recorded request; seconds to its first token, and its usage."""
    r = json.loads((FIXTURES / f"{name}.json").read_text())
    headers = {k: v for k, v in r["headers"].items() if k.lower() not in _DROP}
    body = {**r["body"], "model": "m", "max_tokens": 1}
    t0 = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, Any] = {}
    with c.stream("POST", url + r["path"], headers=headers, content=json.dumps(body)) as resp:
        resp.raise_for_status()
        event = ""
        for line in resp.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
                if ttft is None and event in ("content_block_delta", "message_delta"):
                    ttft = time.perf_counter() - t0
            elif line.startswith("data: ") and event == "message_delta":
                usage = json.loads(line[6:])["usage"]
    assert ttft is not None, "no token came"
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    return {"ttft_s": round(ttft, 3), "prompt_tokens": prompt, "cache_read_input_tokens": usage["cache_read_input_tokens"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from corral.store.embedded import embedded_model_path

    # a state directory of its own: no prompt-cache file of an earlier run may serve the first request
    os.environ["CORRAL_STATE_DIR"] = tempfile.mkdtemp(prefix="corral-agent-turn-")
    p = corral("corral-agent-turn", embedded_model_path(), n_parallel=1, ctx=32768,
               settings={"swa_full": True, "prompt_cache_ram": 0})
    try:
        with httpx.Client(timeout=1800) as c:
            full = first_token(c, p.url, "session_a_first")
            second = first_token(c, p.url, "session_b_first")
            (inst,) = next(m for m in c.get(p.url + "/models").json()["data"] if m["id"] == "m")["instances"]
            memory = {k: inst["memory"][k] for k in ("model_bytes", "kv_bytes", "rss_bytes")}
    finally:
        p.stop()
    speedup = full["ttft_s"] / max(second["ttft_s"], 1e-6)
    reused = second["cache_read_input_tokens"] / second["prompt_tokens"]
    res = {"full_prefill": full, "second_session": second, "speedup": round(speedup, 1),
           "reused_fraction": round(reused, 4), "memory": memory,
           "checks": {"speedup >= 20x": speedup >= GOAL, "reused >= 98%": reused >= 0.98}}
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0 if all(res["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
