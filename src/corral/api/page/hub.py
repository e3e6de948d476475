"""Finding a model on the Hugging Face Hub and knowing whether it fits, before a byte of it
is downloaded: the routes of the page's "Find a model" view and of ``corral search``.

    GET /hub/search?q=TEXT     GGUF repositories matching TEXT (at most 200 characters):
                               {"data": [{"id", "downloads", "likes", "updated", "license",
                               "projector", "gguf_files"}]}
    GET /hub/repo?repo=OWNER/NAME
                               its quantizations: {"repo", "files", "truncated", "projectors",
                               "quants": [{"tag", "files", "size", "split", "projector",
                               "projector_size", "source", ...}]}
    GET /hub/fit?repo=OWNER/NAME&file=PATH[&projector=PATH]
                               the fit estimate of that quantization on this server (its first
                               file; a split model's other parts are read too), from its GGUF
                               header read with range requests (corral.store.remote_header);
                               with the projector a pull brings: its size on the first GPU
                               and the room for the vision side context, as a load plans them
    GET /models/fit?model=ID   the same estimate for a model on disk, before it is loaded

An estimate (``corral.fit.estimate``) is ``{"verdict": "gpu" | "partial" | "host" | "none",
"summary", "gpu_layers", "n_layers", "ctx_per_slot", ...}`` with the ``gpus`` (name and budget,
as ``GET /models`` reports them) and the host memory it was made against.

The Hub is asked in a thread with a time limit (``[server] hub_timeout_s``); at most ``HUB_CALLS``
at once (a Hub that hangs holds that many threads, no more): past either, 503
``hub_unreachable``. A repository that is not there is 404, a gated one 400 ``hub_unauthorized``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from corral.api.http import json_response, plane_of, store_of
from corral.errors import (HubUnauthorized, HubUnreachable, InvalidRequest, ModelFileMissing, NotFound,
                           UnreadableModel)
from corral.fit.estimate import FitEstimate, GpuBudget, estimate
from corral.fit.host import mem_available_bytes
from corral.fit.layout import GGUFError, ModelLayout, read_layout
from corral.model.settings import ModelSettings
from corral.store import hub_search
from corral.store.remote_header import RemoteHeaderError, RemoteHeaders

__all__ = ["router", "HUB_CALLS"]

router = APIRouter()

HUB_CALLS = 4
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_MAX_PARTS = 64
T = TypeVar("T")


def _state(request: Request) -> tuple[asyncio.Semaphore, RemoteHeaders]:
    """The app's Hub call slots and header reader (made on first use)."""
    st = request.app.state
    if getattr(st, "hub_calls", None) is None:
        store = store_of(request)
        if store is None:
            raise NotFound("this server has no model store: nothing to search or pull")
        st.hub_calls = asyncio.Semaphore(HUB_CALLS)
        st.remote_headers = RemoteHeaders(Path(store.meta_dir) / "headers")
    return st.hub_calls, st.remote_headers


async def _ask_hub(request: Request, fn: Callable[[], T], what: str) -> T:
    """``fn`` in a thread, holding one of the ``HUB_CALLS`` slots until it returns (past the
    time limit too: a Hub that hangs holds that many threads, no more)."""
    calls, _ = _state(request)
    timeout = plane_of(request).config.server.hub_timeout_s
    if calls.locked():
        raise HubUnreachable(f"{what}: {HUB_CALLS} requests to the Hub are still waiting for it; "
                             "try again later", retry_after_s=timeout)
    await calls.acquire()
    task = asyncio.ensure_future(asyncio.to_thread(fn))

    def done(t: asyncio.Future[T]) -> None:
        calls.release()
        if not t.cancelled():
            t.exception()  # retrieved: one that ended after the time limit is not logged as lost

    task.add_done_callback(done)
    try:
        return await asyncio.wait_for(asyncio.shield(task), timeout)
    except asyncio.TimeoutError:
        raise HubUnreachable(f"{what}: the Hub did not answer within {timeout:g} s",
                             retry_after_s=timeout) from None
    except hub_search.HubError as exc:
        raise _from_hub(exc) from None
    except RemoteHeaderError as exc:
        if exc.reach:
            raise HubUnreachable(str(exc), retry_after_s=5.0) from None
        raise UnreadableModel(str(exc), param="file") from None


def _from_hub(exc: hub_search.HubError) -> Exception:
    if exc.status == 400:
        return InvalidRequest(str(exc), param="q")
    if exc.status == 404:
        return NotFound(str(exc), param="repo")
    if exc.status == 403:
        return HubUnauthorized(str(exc), param="repo")
    return HubUnreachable(str(exc), retry_after_s=5.0)


def _repo(repo: str) -> str:
    if not _REPO.match(repo):
        raise InvalidRequest(f"repo: {repo[:100]!r} is not owner/name", param="repo")
    return repo


@router.get("/hub/search")
async def hub_search_route(request: Request, q: str = "") -> Response:
    text = q.strip()
    if not text or len(text) > hub_search.MAX_QUERY:
        raise InvalidRequest(f"q: the search text must be 1 to {hub_search.MAX_QUERY} characters "
                             f"(got {len(text)})", param="q")
    hits = await _ask_hub(request, lambda: hub_search.search(text), f"search {text[:40]!r}")
    return json_response({"data": [h.to_dict() for h in hits]})


@router.get("/hub/repo")
async def hub_repo(request: Request, repo: str = "") -> Response:
    name = _repo(repo)
    listing = await _ask_hub(request, lambda: hub_search.repo_quants(name), f"repo {name}")
    return json_response({"repo": listing.repo, "files": listing.files, "truncated": listing.truncated,
                          "projectors": listing.projectors, "quants": [q.to_dict() for q in listing.quants]})


@router.get("/hub/fit")
async def hub_fit(request: Request, repo: str = "", file: str = "", projector: str = "") -> Response:
    name = _repo(repo)
    parts = _parts(file)
    _, headers = _state(request)
    layout = await _ask_hub(request, lambda: headers.layout(name, parts), f"{name}/{file}")
    settings = plane_of(request).config.inherited_settings()
    proj_bytes = 0
    if projector:  # pulled with it: its file on the first GPU, room for the side context
        proj = _parts(projector, "projector")
        if len(proj) != 1:
            raise InvalidRequest("projector: one .gguf file of the repo", param="projector")
        proj_bytes = await _ask_hub(request, lambda: headers.size(name, proj[0]), f"{name}/{projector}")
        settings = msgspec.structs.replace(settings, mmproj=proj[0])
    return json_response(await _estimate(request, layout, settings, first_gpu_bytes=proj_bytes))


def _parts(file: str, param: str = "file") -> list[str]:
    """The file, or every part of a split model named by any of its parts."""
    if (not file.lower().endswith(".gguf") or len(file) > 512 or file.startswith("/") or "\\" in file
            or ".." in file.split("/")):
        raise InvalidRequest(f"{param}: {file[:100]!r} is not a .gguf file of the repo", param=param)
    m = _SPLIT.search(file)
    if m is None:
        return [file]
    n = int(m.group(2))
    if not 1 <= n <= _MAX_PARTS:
        raise InvalidRequest(f"{param}: a split model of {n} parts (at most {_MAX_PARTS})", param=param)
    return [f"{file[:m.start()]}-{k:05d}-of-{n:05d}.gguf" for k in range(1, n + 1)]


@router.get("/models/fit")
async def model_fit(request: Request, model: str = "") -> Response:
    if not model:
        raise InvalidRequest("model: required (GET /models/fit?model=ID)", param="model")
    pool = plane_of(request).pool(model)
    path = Path(pool.spec.path)
    try:
        layout = await asyncio.to_thread(read_layout, path)
    except FileNotFoundError:
        raise ModelFileMissing(f"model {pool.spec.id!r}: its file is missing", param="model") from None
    except (OSError, GGUFError) as exc:
        raise UnreadableModel(f"model {pool.spec.id!r}: cannot read its GGUF header: {exc}",
                              param="model") from None
    body = await _estimate(request, layout, pool.spec, first_gpu_bytes=pool.spec.first_gpu_bytes())
    body["model"] = pool.spec.id
    return json_response(body)


async def _estimate(request: Request, layout: ModelLayout, settings: ModelSettings, *,
                    first_gpu_bytes: int = 0) -> dict[str, Any]:
    """``estimate`` against this server's GPU budgets (the first one less what sits there
    beside the layers: a projector, LoRA adapters, as the router places them) and host."""
    plane = plane_of(request)
    budget = plane.admission.gpus
    gpus: list[GpuBudget] = []
    host = None
    if budget is not None:
        await budget.inventory()
        gpus = [GpuBudget(d.name, max(0, b - first_gpu_bytes) if k == 0 else b, d.max_tensor_bytes)
                for k, (d, b) in enumerate(zip(budget.known, budget.budgets()))]
        host = budget.host_bytes
    if host is None:
        host = mem_available_bytes()
    cap = plane.config.server.memory_budget
    if cap is not None:
        host = min(host, int(cap)) if host is not None else int(cap)
    est: FitEstimate = estimate(layout, settings, gpus=gpus, host_available_bytes=host)
    return {**est.to_dict(), "architecture": layout.architecture,
            "gpus": [{"name": g.name, "budget_bytes": g.budget_bytes} for g in gpus]}
