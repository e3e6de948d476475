"""llama-server's slot API against corral's on the same GGUF (issue 24), one server after the other.

    .venv/bin/python -m bench.checks.slots [--json OUT]

llama-server (``--slot-save-path``) and corral, each with one slot of 2048 cells on the
embedded Gemma 3, same threads and batch:

- a greedy completion, then ``save`` / ``erase`` / ``restore`` of slot 0: the answers have
  the same fields on both (``id_slot, filename, n_saved, n_written, timings.save_ms``; ...);
- the completion after the restore reuses the prefix and answers the same text on both;
- corral's file, copied into llama-server's slot dir, restores there and continues with
  the same text (the file is llama-server's format); llama-server's own file is refused
  by corral (it carries no identity: corral cannot tell which model and settings made it).

Last run (2026-12-04): 8 of 8 pass (until 2026-12-03 corral's text after a reused prefix,
kept or restored, differed from llama-server's: docs/internals/editors.md, "Slot files").

Exit status 0 when every check passes, 1 when one fails, 2 when llama-server is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.checks.editors import LLAMA_SERVER, Proc, corral, llama_server

PROMPT = "The history of the lighthouse keepers of the northern coast, told in order: " * 12
CTX = 2048


def _shape(obj: Any) -> Any:
    """The keys of an answer, nested (values left out)."""
    return {k: _shape(v) for k, v in obj.items()} if isinstance(obj, dict) else type(obj).__name__


def _run(p: Proc, c: httpx.Client, model: str | None) -> dict[str, Any]:
    q = {"model": model} if model else {}

    def complete() -> str:
        r = c.post(p.url + "/v1/completions", json={"model": model or "m", "prompt": PROMPT, "max_tokens": 8,
                                                      "temperature": 0, "ignore_eos": True})
        r.raise_for_status()
        return str(r.json()["choices"][0]["text"])

    def slot(action: str, filename: str | None = None) -> httpx.Response:
        return c.post(p.url + "/slots/0", params={"action": action, **q},
                      json={"filename": filename} if filename else {})

    out: dict[str, Any] = {"fresh": complete(), "kept": complete()}
    for action, name in (("save", "s.bin"), ("erase", None), ("restore", "s.bin")):
        r = slot(action, name)
        out[action] = {"status": r.status_code, "body": r.json()}
    out["restored"] = complete()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if not LLAMA_SERVER.exists():
        print(f"llama-server not found at {LLAMA_SERVER} (python -m bench.llama_server builds it)")
        return 2
    from corral.store.embedded import embedded_model_path

    model = embedded_model_path()
    work = Path(tempfile.mkdtemp(prefix="corral-slots-check-"))
    llama_dir, state = work / "llama-slots", work / "corral-state"
    llama_dir.mkdir()
    os.environ["CORRAL_STATE_DIR"] = str(state)
    res: dict[str, Any] = {}
    with httpx.Client(timeout=300) as c:
        p = llama_server("slots-llama", model, n_parallel=1, ctx=CTX, extra=["--slot-save-path", str(llama_dir) + "/"])
        try:
            res["llama"] = _run(p, c, None)
        finally:
            p.stop()
        p = corral("slots-corral", model, n_parallel=1, ctx=CTX, settings={})
        try:
            res["corral"] = _run(p, c, "m")
            shutil.copy(llama_dir / "s.bin", state / "slots" / "from-llama.bin")
            r = c.post(p.url + "/slots/0", params={"action": "restore", "model": "m"},
                       json={"filename": "from-llama.bin"})
            res["corral_restores_llamas_file"] = {"status": r.status_code, "body": r.json()}
        finally:
            p.stop()
        shutil.copy(state / "slots" / "s.bin", llama_dir / "from-corral.bin")
        p = llama_server("slots-llama-2", model, n_parallel=1, ctx=CTX, extra=["--slot-save-path", str(llama_dir) + "/"])
        try:
            r = c.post(p.url + "/slots/0", params={"action": "restore"}, json={"filename": "from-corral.bin"})
            res["llama_restores_corrals_file"] = {"status": r.status_code, "body": r.json()}
            r = c.post(p.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                        "ignore_eos": True})
            res["llama_after_corrals_file"] = r.json()["choices"][0]["text"]
            res["llama_after_corrals_file_cached"] = r.json().get("usage", {}).get("prompt_tokens_details")
        finally:
            p.stop()
    L, C = res["llama"], res["corral"]
    checks = {
        "same answer fields (save, erase, restore)": all(
            _shape(L[a]["body"]) == _shape(C[a]["body"]) and L[a]["status"] == C[a]["status"] == 200
            for a in ("save", "erase", "restore")),
        "same token counts saved/restored": (L["save"]["body"]["n_saved"] == C["save"]["body"]["n_saved"]
                                             == C["restore"]["body"]["n_restored"]),
        "same fresh text": L["fresh"] == C["fresh"],
        "same text after restore": L["restored"] == C["restored"],
        "restored == kept prefix (each server)": L["restored"] == L["kept"] and C["restored"] == C["kept"],
        "llama-server restores corral's file": res["llama_restores_corrals_file"]["status"] == 200,
        "llama-server continues corral's file like its own": res["llama_after_corrals_file"] == L["restored"],
        "corral refuses llama-server's file (no identity)": res["corral_restores_llamas_file"]["status"] == 400,
    }
    res["checks"] = checks
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(json.dumps({k: res[k] for k in ("llama", "corral")}, indent=1)[:3000])
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
