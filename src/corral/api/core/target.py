"""The model a request names, resolved once where the request enters the API: the client's
name (an id, an alias, or an adapter model's id: corral.api.core.adapter_models) becomes a
``Target``, checked once against the request's key, and that handle goes down to the
plane's ``generate``/``embed``/``tokenize``/``keep_alive`` and the metrics labels. A name
that resolves to nothing is the 404 of an unknown model (the key's hidden models
included), counted in the metrics under "unknown"; a model still being pulled is a 503
with its progress instead."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.requests import Request

from corral import wire
from corral.api.core.adapter_models import find_adapter_model
from corral.api.http import downloads_of, plane_of
from corral.control.plane import ControlPlane
from corral.control.scheduling.pool import ModelPool
from corral.errors import CorralError, ModelDownloading, ModelError, ModelNotFound

__all__ = ["Target", "find", "resolve", "pull_if_needed"]

log = logging.getLogger("corral.api")


@dataclass(frozen=True, slots=True)
class Target:
    pool: ModelPool  # the model whose workers serve the request (an adapter model's: its base)
    implied: list[wire.LoraScale] | None = None  # an adapter model id's scales: only its adapter, at its scale

    @property
    def id(self) -> str:
        return self.pool.spec.id


def resolve(request: Request, name: str, endpoint: str, *, adapters: bool = True) -> Target:
    """The ``Target`` ``name`` names (``adapters``: an adapter model id too); the errors of
    the module's docstring."""
    plane = plane_of(request)
    try:
        target = find(plane, name, adapters=adapters)
    except CorralError as exc:
        plane.metrics.observe_request("unknown", None, endpoint, exc.status)
        _raise_if_downloading(request, name, exc)
        raise
    pull_if_needed(request, target.pool)
    return target


_pull_tasks: set[asyncio.Task[object]] = set()  # pulls started for a request, kept until they began


def pull_if_needed(request: Request, pool: ModelPool) -> None:
    """A model pulled when first needed (``spec.pull``: a preset's hf-repo) whose file is
    not here yet: its pull starts now (through the store, with progress, cancel and resume
    as any pull) or goes on, and the request is a 503 with its progress; once the file is
    here, the model loads like any other."""
    spec = pool.spec
    if spec.pull is None or spec.path.exists():
        return
    dm = downloads_of(request)
    if dm is None:
        raise ModelError(f"model {spec.id!r} comes from {spec.pull} and is not pulled yet; "
                         "this server has no store to pull it into")
    pull = dm.find_by_model(spec.id)
    if pull is None:
        task = asyncio.ensure_future(dm.start(spec.pull, model_id=spec.id))
        _pull_tasks.add(task)
        task.add_done_callback(_pull_started)
        raise ModelDownloading(f"model {spec.id!r} is being pulled from {spec.pull} (started now; "
                               "GET /models shows its progress); try again later", retry_after_s=5)
    p = pull.progress()
    done = f"{p['done']} of {p['total']} bytes" if p.get("total") else f"{p['done']} bytes"
    raise ModelDownloading(f"model {spec.id!r} is still being pulled from {spec.pull} ({done}); "
                           "try again later", retry_after_s=5)


def _pull_started(task: asyncio.Task[object]) -> None:
    _pull_tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:  # published as download_failed too
        log.warning("pull failed to start: %s", task.exception())


def find(plane: ControlPlane, name: str, *, adapters: bool = True) -> Target:
    """``resolve`` without the metrics and the download check (loading, unloading)."""
    try:
        return Target(plane.pool(name))
    except ModelNotFound:
        found = find_adapter_model(plane, name) if adapters else None
        if found is None:
            raise
        return Target(found.base, [wire.LoraScale(found.position, found.adapter.scale)])


def _raise_if_downloading(request: Request, name: str, exc: CorralError) -> None:
    """A model that is still being pulled is not "not found": 503 with its progress."""
    dm = downloads_of(request)
    if not isinstance(exc, ModelNotFound) or dm is None:
        return
    pull = dm.find_by_model(name)
    if pull is not None:
        p = pull.progress()
        done = f"{p['done']} of {p['total']} bytes" if p.get("total") else f"{p['done']} bytes"
        raise ModelDownloading(f"model {name!r} is still downloading ({done}); try again later",
                               retry_after_s=5) from None
