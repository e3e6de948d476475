"""`corral search TEXT`: the Hub's GGUF repositories matching TEXT (GET /hub/search), and
`corral search --repo OWNER/NAME`: its quantizations with their sizes and whether each fits
the server (GET /hub/repo, GET /hub/fit), as the page's "Find a model" panel shows them."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.cli.client import Api, ApiError, HostOpt, PortOpt, ServerOpt, fail, server_url
from corral.units import fmt_bytes

__all__ = ["register", "search"]

out = Console(highlight=False)
_BADGE = {"gpu": ("fits on the GPU", "green"), "partial": ("partly offloaded", "cyan"),
          "host": ("host RAM only", "yellow"), "none": ("does not fit", "red")}


def search(text: list[str] = typer.Argument(None, help="words to search for (e.g. qwen coder)"),
           repo: str | None = typer.Option(None, "--repo", help="list this repo's quantizations and their fit"),
           as_json: bool = typer.Option(False, "--json", help="print JSON"),
           host: str | None = HostOpt, port: int | None = PortOpt, server: str | None = ServerOpt) -> None:
    """Search the Hugging Face Hub for GGUF models, or list a repo's quantizations and whether each fits."""
    if not repo and not text:
        fail("give words to search for, or --repo OWNER/NAME")
    with Api(server_url(host, port, server), timeout=120) as api:
        try:
            if repo:
                _repo(api, repo, as_json)
            else:
                _search(api, " ".join(text), as_json)
        except ApiError as exc:
            fail(str(exc))


def _search(api: Api, text: str, as_json: bool) -> None:
    hits = api.get("/hub/search", params={"q": text})["data"]
    if as_json:
        out.print_json(json.dumps(hits))
        return
    if not hits:
        out.print(Text(f"no GGUF repositories match {text!r}"))
        return
    table = Table(box=None, pad_edge=False)
    for col in ("repo", "downloads", "likes", "updated", "license", "projector"):
        table.add_column(col, overflow="fold")
    for h in hits:
        table.add_row(Text(h["id"]), str(h["downloads"]), str(h["likes"]), (h.get("updated") or "-")[:10],
                      Text(h.get("license") or "-"), "vision/audio" if h["projector"] else "")
    out.print(table)
    out.print(Text("corral search --repo OWNER/NAME lists a repo's quantizations and whether each fits",
                   style="dim"))


def _repo(api: Api, repo: str, as_json: bool) -> None:
    listing = api.get("/hub/repo", params={"repo": repo})
    fits: list[dict[str, Any]] = []
    for q in listing["quants"]:
        try:
            params = {"repo": repo, "file": q["files"][0], **({"projector": q["projector"]} if q.get("projector") else {})}
            fits.append(api.get("/hub/fit", params=params))
        except ApiError as exc:
            fits.append({"error": str(exc)})
    if as_json:
        out.print_json(json.dumps({**listing, "quants": [{**q, "fit": f} for q, f in zip(listing["quants"], fits)]}))
        return
    if listing.get("truncated"):
        out.print(Text(f"(the repo has more files than the first {listing['files']} listed)", style="dim"))
    table = Table(box=None, pad_edge=False)
    for col in ("quantization", "size", "fit", "pull with"):
        table.add_column(col, overflow="fold")
    for q, f in zip(listing["quants"], fits):
        tag = q["tag"] + (f" (split, {len(q['files'])} parts)" if q["split"] else "")
        if "error" in f:
            fit = Text("fit unknown: " + f["error"], style="red")
        else:
            label, style = _BADGE.get(f["verdict"], (f["verdict"], ""))
            fit = Text(label, style=style) + Text(": " + f["summary"])
        size = fmt_bytes(q["size"]) + (f" + {fmt_bytes(q['projector_size'])} projector" if q.get("projector") else "")
        table.add_row(Text(tag), size, fit, Text(q["source"] or "- (split: merge with llama-gguf-split)"))
    out.print(table)


def register(app: typer.Typer) -> None:
    """Adds this module's command to the `corral` app."""
    app.command("search")(search)
