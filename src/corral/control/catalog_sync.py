"""Catalog sync: models appear, change and go while the router runs.

Sources of change: a reload (``POST /models/reload``, SIGHUP: the config file and
models_dir are read again), Nitro's loadmodel (``add_model``), a finished pull
(``on_download_finished``) and a deleted file (``remove_model``).

- removed models unload (running requests finish) and disappear (404);
- models whose worker settings changed restart through admission (drain, stop, load
  again within the budget); requests arriving meanwhile queue for the new workers;
- alias/ttl/pinned changes apply live;
- a name a request gives a model (Ollama's copy, Nitro's model_id: ``check_new_name``)
  must be one the request's key may use, and never an adapter model's id (it would
  shadow the adapter for every key);
- new models appear (and load if ``load_on_startup``).

A pool is added in one place (``add``), which also publishes ``model_added``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from corral.config.file import CorralConfig
from corral.control.placement.admission import Admission
from corral.control.catalog import Catalog, ModelSpec, specs_from_config
from corral.events import EventBus, EventName
from corral.control.scheduling.pool import ModelPool
from corral.control.keys.ring import current_caller
from corral.errors import Conflict, InvalidRequest, ModelNotFound, NameNotAllowed
from corral.model.ids import id_problem
from corral.model.settings import ModelSettings
from corral.store.gguf import check_file

if TYPE_CHECKING:
    from corral.store.local import LocalModel, ModelStore

__all__ = ["CatalogSync"]

log = logging.getLogger("corral.catalog")

Embedded = tuple[str, Path, tuple[str, ...]]


class CatalogSync:
    def __init__(self, *, catalog: Catalog, pools: dict[str, ModelPool], bus: EventBus,
                 admission: Admission, make_pool: Callable[[ModelSpec], ModelPool],
                 load_soon: Callable[[ModelPool], None], store: ModelStore | None = None,
                 embedded: Embedded | None = None) -> None:
        self.catalog = catalog
        self.pools = pools
        self._bus = bus
        self._admission = admission
        self._make_pool = make_pool
        self._load_soon = load_soon
        self.store = store
        self._embedded = embedded
        self._extra_specs: dict[str, ModelSpec] = {}  # added at run time (Nitro loadmodel, pulls)
        self._copies: dict[str, str] = {}  # alias -> model id, added by Ollama's /api/copy

    def _read_files(self, cfg: CorralConfig) -> tuple[list[LocalModel] | None, dict[Path, str]]:
        """The store's models (None when models_dir cannot be listed) and why each config
        model's file does not read (blocking: reads headers, cached per file version; run
        off the event loop). A file's problem counts only for corral's own worker: another
        ``worker_command`` reads its files its own way."""
        store_models: list[LocalModel] | None = []
        if self.store is not None:
            try:
                store_models = self.store.list()
            except Exception as exc:  # noqa: BLE001 - an unreadable models_dir must not stop the router
                log.warning("cannot list models_dir (its models stay as they were): %s", exc)
                store_models = None
        if cfg.server.worker_command is not None:
            return [dataclasses.replace(m, problem=None) for m in store_models or []], {}
        problems = {m.path: p for m in cfg.models.values()
                    if m.path is not None and (p := check_file(m.path).problem) is not None}
        return store_models, problems

    async def specs(self, cfg: CorralConfig) -> list[ModelSpec]:
        """Every model ``cfg`` (plus models_dir, the embedded model and what was added at
        run time) names; the files are read off the event loop. Where models_dir cannot be
        listed, the store's models stay as they are (never all unloaded by one bad read)."""
        store_models, problems = await asyncio.to_thread(self._read_files, cfg)
        embedded = self._embedded if cfg.server.include_default_model else None
        specs = specs_from_config(cfg, store_models or [], embedded, problems)
        if store_models is None:
            taken = {s.id for s in specs} | {a for s in specs for a in s.aliases}
            specs += [p.spec for p in self.pools.values() if p.spec.source == "store" and p.spec.id not in taken]
        ids = {s.id for s in specs}
        specs += [s for mid, s in self._extra_specs.items() if mid not in ids]
        if self._copies:  # aliases added at run time (Ollama's /api/copy) outlive reloads
            taken = ids | {a for s in specs for a in s.aliases}
            specs = [msgspec.structs.replace(s, aliases=s.aliases + tuple(
                a for a, mid in self._copies.items() if mid == s.id and a not in taken)) for s in specs]
        return specs

    def adapter_ids(self) -> set[str]:
        """Every adapter model id (a ``lora`` entry's ``model``), whoever may see it."""
        return {a.model for p in self.pools.values() for a in p.spec.lora if a.model is not None}

    def check_new_name(self, name: str, param: str) -> None:
        """NameNotAllowed (403) unless the request's key may use ``name`` (its ``models``
        patterns cover it: a name outside them may be another key's model); Conflict (409)
        if it is an adapter model's id, bare or with Ollama's ``:latest``."""
        caller = current_caller()
        if caller is not None and not caller.key.sees(name):
            raise NameNotAllowed(f"{param}: {name!r} is not among the models key {caller.name!r} may use "
                                 f"({', '.join(caller.key.patterns)}); a key may name only those", param=param)
        if name in self.adapter_ids() or name.removesuffix(":latest") in self.adapter_ids():
            raise Conflict(f"{param}: {name!r} is already the name of a model; choose another", param=param)

    def add_alias(self, model_id: str, alias: str) -> str:
        """Make ``alias`` another name of ``model_id`` (Ollama's copy); returns the id.
        InvalidRequest for an invalid name, NameNotAllowed or Conflict (``check_new_name``)
        for a name the key may not give, Conflict if it already names another model."""
        problem = id_problem(alias)
        if problem is not None:
            raise InvalidRequest(f"invalid model name {alias!r}: {problem}", param="destination")
        self.check_new_name(alias, "destination")
        try:
            other = self.catalog.resolve_id(alias)
        except ModelNotFound:
            other = None
        if other is not None and other != model_id:
            raise Conflict(f"{alias!r} already names model {other!r}", param="destination")
        if other is None:
            self._copies[alias] = model_id
            pool = self.pools[model_id]
            pool.spec = msgspec.structs.replace(pool.spec, aliases=pool.spec.aliases + (alias,))
            self.catalog.put(pool.spec)
        return model_id

    def add(self, spec: ModelSpec, *, announce: bool = True) -> ModelPool:
        """The one way a model becomes servable."""
        self.catalog.put(spec)
        pool = self._make_pool(spec)
        self.pools[spec.id] = pool
        if announce:
            self._bus.publish(EventName.MODEL_ADDED, spec.id, source=spec.source)
        return pool

    # ------------------------------------------------------------------ run-time changes

    async def add_model(self, spec: ModelSpec, *, replace: bool = False) -> ModelPool:
        """A model learned at run time (Nitro loadmodel, a finished pull)."""
        existing = self.pools.get(spec.id)
        if existing is not None:
            if replace and existing.spec != spec and existing.spec.worker_key() == spec.worker_key():
                self._extra_specs[spec.id] = spec  # what a request carries changed: no restart
                existing.spec = spec
                self.catalog.put(spec)
            if not replace or existing.spec.worker_key() == spec.worker_key():
                return existing
            self._extra_specs[spec.id] = spec
            await self._restart(existing, spec)
            return existing
        self._extra_specs[spec.id] = spec
        return self.add(spec)

    async def on_download_finished(self, model_id: str, path: Path, inherited: ModelSettings) -> None:
        pool = self.pools.get(model_id)
        if pool is not None and pool.spec.pull is not None and not pool.occupies:
            # a model pulled when first needed (a preset's hf-repo): its file is here now
            store = self.store  # its manifest: the projector; its header checked (off the loop)
            pulled = await asyncio.to_thread(store.get, model_id) if store is not None else None
            pool.spec = msgspec.structs.replace(
                pool.spec, path=Path(path),
                mmproj=str(pulled.mmproj) if pulled is not None and pulled.mmproj and not pool.spec.mmproj
                else pool.spec.mmproj,
                problem=pulled.problem if pulled is not None else None)
            self.catalog.put(pool.spec)
            return
        if model_id not in self.pools:
            store = self.store  # its manifest: the projector; its header checked (off the loop)
            pulled = await asyncio.to_thread(store.get, model_id) if store is not None else None
            if model_id not in self.pools:
                self.add(ModelSpec.make(model_id, Path(path), inherited, source="store",
                                        projector=pulled.mmproj if pulled is not None else None,
                                        problem=pulled.problem if pulled is not None else None))

    async def remove_model(self, model_id: str) -> None:
        """Unload (if needed) and forget a model (e.g. its file was deleted)."""
        pool = self.pools.get(model_id)
        if pool is None:
            return
        await self._admission.unload(pool, "model removed", drain=True,
                                     waiters_exc=ModelNotFound(f"model {model_id!r} was removed",
                                                               param="model"))
        pool.discard()
        del self.pools[model_id]
        self.catalog.remove(model_id)
        self._extra_specs.pop(model_id, None)
        self._bus.publish(EventName.MODEL_REMOVED, model_id)

    async def _restart(self, pool: ModelPool, spec: ModelSpec) -> None:
        def apply() -> None:
            pool.spec = spec
            self.catalog.put(spec)

        await self._admission.restart(pool, apply)

    # ------------------------------------------------------------------ reload

    async def reload(self, config: CorralConfig) -> dict[str, list[str]]:
        """Bring the pools in line with ``config``. Changed models restart, removed ones
        unload, running requests finish. Models whose restart or removal failed are
        logged and listed under ``failed``."""
        new_specs = {s.id: s for s in await self.specs(config)}
        result: dict[str, list[str]] = {"added": [], "removed": [], "restarted": [], "updated": []}
        jobs: dict[str, asyncio.Future[None] | Any] = {}
        for mid in list(self.pools):
            if mid not in new_specs:
                result["removed"].append(mid)
                jobs[mid] = self.remove_model(mid)
        for mid, spec in new_specs.items():
            pool = self.pools.get(mid)
            if pool is None:
                pool = self.add(spec)
                result["added"].append(mid)
                if spec.load_on_startup:
                    self._load_soon(pool)
                continue
            if pool.failed_final:
                pool.forget_failure()  # a reload is a fresh chance
            if pool.spec.worker_key() != spec.worker_key():
                result["restarted"].append(mid)
                jobs[mid] = self._restart(pool, spec)
            elif pool.spec != spec:
                pool.spec = spec
                self.catalog.put(spec)
                result["updated"].append(mid)
        outcomes = await asyncio.gather(*jobs.values(), return_exceptions=True)
        failed = []
        for mid, outcome in zip(jobs, outcomes):
            if isinstance(outcome, BaseException):
                log.warning("reload: %s failed: %s", mid, outcome)
                failed.append(mid)
        if failed:
            result["failed"] = failed
        self._bus.publish(EventName.CONFIG_RELOADED, None, **result)
        self._admission.notify_capacity()
        return result
