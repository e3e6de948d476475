"""The control plane: the one object the HTTP layer talks to (``app.state.router``).

It owns the catalog, one ``ModelPool`` per model, the load/eviction policy, idle TTL
and config reload. It never imports llama_cpp and never touches a GPU: every model
instance is a worker process (``Instance``).

Life of a request (``generate``/``embed``): resolve the name (id or alias) -> make
sure the model is loaded (autoload: load it, first making room) -> take a free slot
or queue for one -> write the request to that worker -> return the ``RequestStream``
the API reads from. Loads never block requests to other models: the admission lock
is held only while deciding what to evict and starting workers, never while serving.

Budget: ``max_loaded_models`` and ``memory_budget`` (the bytes workers report in
Ready/Stats: weights + KV cache; for a model never loaded, its file size). A load
beyond the budget evicts the least recently used idle model; a model with requests
running or queued, a model that is loading, and a pinned model are never evicted:
the load then waits up to ``queue_timeout_s`` and fails with 503 ``CapacityTimeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corral import wire
from corral.config import CorralConfig
from corral.control import views
from corral.control.catalog import Catalog, ModelSpec, default_threads, specs_from_config
from corral.control.events import EventBus
from corral.control.instance import Instance, InstanceState
from corral.control.metrics import Metrics
from corral.control.pool import ModelPool
from corral.control.process import Launcher
from corral.control.stream import RequestStream
from corral.errors import (CapacityTimeout, Conflict, InvalidRequest, LoadFailed, ModelNotFound,
                           ModelNotLoaded, Unavailable)
from corral.model_ids import id_problem

__all__ = ["ControlPlane"]

log = logging.getLogger("corral.plane")

_STATS_EVERY_S = 10.0


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class ControlPlane:
    def __init__(self, config: CorralConfig, *, bus: EventBus | None = None,
                 metrics: Metrics | None = None, store: Any = None,
                 config_loader: Callable[[], CorralConfig] | None = None,
                 embedded: tuple[str, Path, tuple[str, ...]] | None = None) -> None:
        self.config = config
        self.bus = bus or EventBus()
        self.metrics = metrics or Metrics()
        self.store = store
        self._config_loader = config_loader
        self._embedded = embedded
        self.catalog = Catalog()
        self.pools: dict[str, ModelPool] = {}
        self._extra_specs: dict[str, ModelSpec] = {}  # added at run time (Nitro loadmodel, pulls)
        self._copies: dict[str, str] = {}  # alias -> model id, added by Ollama's /api/copy
        self._tmp_logs: tempfile.TemporaryDirectory[str] | None = None
        self.launcher = self._make_launcher(config)
        self._admit: asyncio.Lock | None = None
        self._capacity: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._housekeeper: asyncio.Task[None] | None = None
        self._closed = False
        self.started_at = time.time()
        self.metrics.watch(self.snapshot)

    # ================================================================ lifecycle

    def _make_launcher(self, cfg: CorralConfig) -> Launcher:
        srv = cfg.server
        if srv.log_dir is not None:
            log_dir = srv.log_dir
        else:
            if self._tmp_logs is None:
                self._tmp_logs = tempfile.TemporaryDirectory(prefix="corral-logs-")
            log_dir = Path(self._tmp_logs.name)
        launcher = Launcher(log_dir=log_dir, load_timeout_s=srv.load_timeout_s,
                            stop_grace_s=srv.stop_grace_s, max_restarts=srv.max_restarts,
                            restart_backoff_s=srv.restart_backoff_s)
        if srv.worker_command:
            launcher.worker_command = list(srv.worker_command)
        return launcher

    def _specs(self, cfg: CorralConfig) -> list[ModelSpec]:
        store_models = []
        if self.store is not None:
            try:
                store_models = self.store.list()
            except Exception as exc:  # an unreadable models_dir must not stop the router
                log.warning("cannot list models_dir: %s", exc)
        embedded = self._embedded if cfg.server.include_default_model else None
        specs = specs_from_config(cfg, store_models, embedded)
        ids = {s.id for s in specs}
        specs += [s for mid, s in self._extra_specs.items() if mid not in ids]
        if self._copies:  # aliases added at run time (Ollama's /api/copy) outlive reloads
            taken = ids | {a for s in specs for a in s.aliases}
            specs = [dataclasses.replace(s, aliases=s.aliases + tuple(
                a for a, mid in self._copies.items() if mid == s.id and a not in taken)) for s in specs]
        return specs

    def add_alias(self, name: str, alias: str) -> str:
        """Make ``alias`` another name of model ``name`` (Ollama's copy); returns the id.
        InvalidRequest for an invalid name, Conflict if it already names another model."""
        mid = self.resolve(name)
        problem = id_problem(alias)
        if problem is not None:
            raise InvalidRequest(f"invalid model name {alias!r}: {problem}", param="destination")
        try:
            other = self.catalog.resolve_id(alias)
        except ModelNotFound:
            other = None
        if other is not None and other != mid:
            raise Conflict(f"{alias!r} already names model {other!r}", param="destination")
        if other is None:
            self._copies[alias] = mid
            pool = self.pools[mid]
            pool.spec = dataclasses.replace(pool.spec, aliases=pool.spec.aliases + (alias,))
            self.catalog.put(pool.spec)
        return mid

    async def start(self) -> None:
        self._admit = asyncio.Lock()
        for spec in self._specs(self.config):
            self._add_pool(spec)
        self._housekeeper = asyncio.get_running_loop().create_task(self._housekeep(), name="housekeeper")
        for pool in self.pools.values():
            if pool.spec.load_on_startup:
                self._background(self._load_logged(pool), f"load {pool.spec.id}")

    async def close(self) -> None:
        """Stop every worker (graceful, then the process group is killed)."""
        self._closed = True
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        for t in list(self._tasks):
            t.cancel()
        for pool in self.pools.values():
            pool.fail_waiters(Unavailable("the server is shutting down"))
        await asyncio.gather(*(p.stop("router shutting down") for p in self.pools.values()),
                             return_exceptions=True)
        for pool in self.pools.values():
            for inst in pool.instances:
                inst.discard()
        if self._tmp_logs is not None:
            with contextlib.suppress(OSError):
                self._tmp_logs.cleanup()

    def _add_pool(self, spec: ModelSpec) -> ModelPool:
        self.catalog.put(spec)
        pool = ModelPool(spec, make_instance=self._make_instance, on_capacity=self._notify_capacity)
        self.pools[spec.id] = pool
        return pool

    def _make_instance(self, pool: ModelPool, index: int) -> Instance:
        spec = pool.spec
        threads = spec.threads or default_threads(spec, self.config.server.max_loaded_models,
                                                  len(self.pools))

        def on_change(inst: Instance) -> None:
            pool.on_instance_change(inst)
            self._observe_transition(inst)

        return Instance(spec, index, launcher=self.launcher, bus=self.bus, threads=threads,
                        on_change=on_change, on_slot_free=pool.release)

    def _observe_transition(self, inst: Instance) -> None:
        m, i = inst.spec.id, str(inst.index)
        if inst.state is InstanceState.READY:
            self.metrics.loads.labels(m, i).inc()
            if inst.last_load_s is not None:
                self.metrics.load_duration.labels(m, i).observe(inst.last_load_s)
        elif inst.state is InstanceState.FAILED:
            self.metrics.failures.labels(m, i).inc()
            if inst.restart_pending:
                self.metrics.restarts.labels(m, i).inc()

    def _background(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load_logged(self, pool: ModelPool) -> None:
        try:
            await self.load(pool.spec.id)
        except Exception as exc:
            log.warning("loading %s failed: %s", pool.spec.id, exc)

    # ================================================================ requests

    def resolve(self, name: str) -> str:
        return self.catalog.resolve_id(name)

    def pool(self, name: str) -> ModelPool:
        mid = self.catalog.resolve_id(name)
        pool = self.pools.get(mid)
        if pool is None:
            raise ModelNotFound(f"model {name!r} not found", param="model")
        return pool

    async def generate(self, name: str, msg: wire.GenerateRequest, prefix: str | None) -> RequestStream:
        """Slot taken and request sent; read the result from the returned stream."""
        return await self._submit(name, msg, prefix)

    async def embed(self, name: str, msg: wire.EmbedRequest) -> RequestStream:
        return await self._submit(name, msg, None)

    async def tokenize(self, name: str, msg: wire.TokenizeRequest) -> RequestStream:
        """Tokenize or detokenize with the model's vocabulary (answered by ``Tokenized``)."""
        return await self._submit(name, msg, None)

    async def _submit(self, name: str, msg: Any, prefix: str | None) -> RequestStream:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.server.queue_timeout_s
        while True:
            pool = self.pool(name)
            stream = RequestStream(msg.id, pool.spec.id, _input_param(msg))
            inst = pool.try_acquire(prefix)
            if inst is None:
                if not pool.has_ready and not pool.draining:
                    await self._ensure_loaded(pool)
                    inst = pool.try_acquire(prefix)
                if inst is None:
                    inst = await pool.wait_slot(prefix, max_queue=self.config.server.max_queue,
                                                deadline=deadline)
                    if inst is None:  # the model went away; start over
                        if loop.time() >= deadline:
                            raise CapacityTimeout(f"model {name!r} is not available", retry_after_s=1)
                        continue
            if inst.submit(msg, stream):
                return stream
            pool.release(inst)  # it died just now; its slots are gone, so we queue next time

    async def _ensure_loaded(self, pool: ModelPool) -> None:
        if pool.occupies:
            await pool.wait_ready(self.config.server.load_timeout_s)
            return
        if pool.failed_final:
            raise LoadFailed(f"model {pool.spec.id!r} failed: {pool.failure_reason}; "
                             "POST /models/load to try again")
        if not self.config.server.autoload:
            raise ModelNotLoaded(f"model {pool.spec.id!r} is not loaded and autoload is off; "
                                 "load it with POST /models/load", param="model")
        await self._load_pool(pool)

    def keep_alive(self, name: str, seconds: float | None) -> None:
        """Ollama's ``keep_alive``, applied when a request ends: None leaves the model's
        configured ttl_s; 0 unloads it as soon as it is idle; > 0 unloads it after that
        many idle seconds; < 0 keeps it loaded (never evicted) until it is unloaded."""
        try:
            pool = self.pool(name)
        except ModelNotFound:
            return
        if seconds is None or not pool.occupies or pool.spec.pinned:
            return  # a model pinned in the config stays loaded whatever a request asks
        pool.keep_alive_s = seconds
        if seconds == 0:
            self._background(self._unload_idle(pool, "keep_alive=0"), f"keep_alive {pool.spec.id}")

    # ================================================================ load / unload

    def is_loaded(self, model_id: str) -> bool:
        """Loaded or loading (it holds, or will hold, memory)."""
        pool = self.pools.get(model_id)
        return pool is not None and pool.occupies

    async def load(self, name: str) -> None:
        """Explicit load: also retries a model that failed for good."""
        pool = self.pool(name)
        await self._load_pool(pool)  # a pool that failed for good starts with fresh instances

    async def _load_pool(self, pool: ModelPool) -> None:
        assert self._admit is not None
        if not pool.occupies:
            async with self._admit:
                if not pool.occupies:
                    await self._make_room(pool)
                    pool.start()
        await pool.wait_ready(self.config.server.load_timeout_s)
        if self.config.server.memory_budget is not None:
            self._background(self._trim(pool), "trim")

    async def _make_room(self, pool: ModelPool) -> None:
        """Evict LRU idle models until ``pool`` fits; wait for room up to queue_timeout_s."""
        srv = self.config.server
        loop = asyncio.get_running_loop()
        deadline = loop.time() + srv.queue_timeout_s
        budget = srv.memory_budget
        need = pool.estimate_bytes()
        if budget is not None and need > budget:
            raise LoadFailed(f"model {pool.spec.id!r} needs about {_fmt_bytes(need)}, more than "
                             f"memory_budget ({_fmt_bytes(budget)})")
        while True:
            others = [p for p in self.pools.values() if p is not pool and p.occupies]
            over_count = len(others) + 1 > srv.max_loaded_models
            used = sum(p.memory_bytes() for p in others)
            over_mem = budget is not None and used + need > budget
            if not over_count and not over_mem:
                return
            victims = sorted((p for p in others if p.evictable), key=lambda p: p.last_used)
            if victims:
                why = (f"max_loaded_models={srv.max_loaded_models}" if over_count
                       else f"memory_budget={_fmt_bytes(budget or 0)}")
                await self._unload_pool(victims[0], f"evicted to make room for {pool.spec.id} ({why})",
                                        drain=False)
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                what = (f"{len(others)} models loaded (max_loaded_models={srv.max_loaded_models})"
                        if over_count else
                        f"{_fmt_bytes(used)} of memory_budget {_fmt_bytes(budget or 0)} in use")
                raise CapacityTimeout(f"no room to load model {pool.spec.id!r}: {what} and none "
                                      "can be evicted (busy, loading or pinned); try again later",
                                      retry_after_s=5)
            await self._wait_capacity(remaining)

    async def _trim(self, loaded: ModelPool) -> None:
        """After a load, with real numbers: evict LRU idle models while over budget."""
        budget = self.config.server.memory_budget
        assert self._admit is not None and budget is not None
        async with self._admit:
            while True:
                active = [p for p in self.pools.values() if p.occupies]
                if sum(p.memory_bytes() for p in active) <= budget:
                    return
                victims = sorted((p for p in active if p is not loaded and p.evictable),
                                 key=lambda p: p.last_used)
                if not victims:
                    log.warning("over memory_budget after loading %s; nothing idle to evict", loaded.spec.id)
                    return
                await self._unload_pool(victims[0], f"evicted: over memory_budget after loading "
                                        f"{loaded.spec.id}", drain=False)

    async def unload(self, name: str, reason: str = "unloaded by request") -> bool:
        """Let running requests finish (up to drain_timeout_s), then stop the workers.
        Requests queued for it get 503. False when it was not loaded."""
        pool = self.pool(name)
        was = pool.occupies or bool(pool.instances)
        await self._unload_pool(pool, reason, drain=True,
                                waiters_exc=Unavailable(f"model {pool.spec.id!r} was unloaded",
                                                        retry_after_s=1))
        return was

    async def _unload_pool(self, pool: ModelPool, reason: str, *, drain: bool,
                           waiters_exc: Exception | None = None) -> None:
        pool.draining = True
        try:
            if drain and pool.inflight:
                await pool.wait_idle(self.config.server.drain_timeout_s)
            await pool.stop(reason)
        finally:
            pool.draining = False
            if waiters_exc is not None:
                pool.fail_waiters(waiters_exc)
            else:
                pool.wake_waiters()
            self._notify_capacity()

    async def _unload_idle(self, pool: ModelPool, reason: str) -> None:
        """Unload only if still idle when this runs (a request may have come meanwhile);
        the check and the draining flag happen with no await in between."""
        if not pool.idle or pool.draining or not pool.occupies:
            return
        await self._unload_pool(pool, reason, drain=False)

    def _notify_capacity(self) -> None:
        c = self._capacity
        if c is not None and not c.done():
            c.set_result(None)

    async def _wait_capacity(self, timeout_s: float) -> None:
        if self._capacity is None or self._capacity.done():
            self._capacity = asyncio.get_running_loop().create_future()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._capacity), timeout_s)

    # ================================================================ catalog changes

    async def add_model(self, spec: ModelSpec, *, replace: bool = False) -> ModelPool:
        """A model learned at run time (Nitro loadmodel, a finished pull)."""
        existing = self.pools.get(spec.id)
        if existing is not None:
            if not replace or existing.spec.worker_key() == spec.worker_key():
                return existing
            await self._restart_pool(existing, spec)
            self._extra_specs[spec.id] = spec
            return existing
        self._extra_specs[spec.id] = spec
        pool = self._add_pool(spec)
        self.bus.publish("model_added", spec.id, source=spec.source)
        return pool

    def on_download_finished(self, model_id: str, path: Path) -> None:
        """DownloadManager callback: the pulled model can be served now."""
        if model_id in self.pools:
            return
        spec = ModelSpec.make(model_id, Path(path), self.config.inherited_settings(), source="store")
        self._add_pool(spec)
        self.bus.publish("model_added", model_id, source="store")

    async def remove_model(self, model_id: str) -> None:
        """Unload (if needed) and forget a model (e.g. its file was deleted)."""
        pool = self.pools.get(model_id)
        if pool is None:
            return
        await self._unload_pool(pool, "model removed", drain=True,
                                waiters_exc=ModelNotFound(f"model {model_id!r} was removed", param="model"))
        for inst in pool.instances:
            inst.discard()
        del self.pools[model_id]
        self.catalog.remove(model_id)
        self._extra_specs.pop(model_id, None)
        self.bus.publish("model_removed", model_id)

    async def on_model_removed(self, model_id: str) -> None:
        """Store callback: the model's file was deleted."""
        await self.remove_model(model_id)

    async def _restart_pool(self, pool: ModelPool, spec: ModelSpec) -> None:
        """New worker settings: drain, stop, swap the spec, start again if it was loaded.
        Requests arriving meanwhile queue and are served by the new workers."""
        was_active = pool.occupies
        pool.draining = True
        try:
            if was_active:
                await pool.wait_idle(self.config.server.drain_timeout_s)
                await pool.stop("config changed: restarting with new settings")
            pool.spec = spec
            self.catalog.put(spec)
            if was_active:
                pool.start()
        finally:
            pool.draining = False
        if was_active:
            try:
                await pool.wait_ready(self.config.server.load_timeout_s)
            except Exception as exc:
                log.warning("restart of %s failed: %s", spec.id, exc)
        elif pool.waiters:
            pool.wake_waiters()

    async def reload(self, config: CorralConfig | None = None) -> dict[str, list[str]]:
        """Re-read the config (and models_dir). Changed models restart, removed ones
        unload, running requests finish. A bad config changes nothing (ConfigError)."""
        if config is None:  # no loader: the same config, models_dir rescanned
            config = self._config_loader() if self._config_loader is not None else self.config
        new_specs = {s.id: s for s in self._specs(config)}
        self.config = config
        self.launcher.__dict__.update(self._make_launcher(config).__dict__)
        result: dict[str, list[str]] = {"added": [], "removed": [], "restarted": [], "updated": []}
        jobs = []
        for mid in list(self.pools):
            if mid not in new_specs:
                result["removed"].append(mid)
                jobs.append(self.remove_model(mid))
        for mid, spec in new_specs.items():
            pool = self.pools.get(mid)
            if pool is None:
                self._add_pool(spec)
                self.bus.publish("model_added", mid, source=spec.source)
                result["added"].append(mid)
                if spec.load_on_startup:
                    self._background(self._load_logged(self.pools[mid]), f"load {mid}")
            elif pool.spec.worker_key() != spec.worker_key():
                result["restarted"].append(mid)
                jobs.append(self._restart_pool(pool, spec))
            elif pool.spec != spec:
                pool.spec = spec
                self.catalog.put(spec)
                result["updated"].append(mid)
            if mid in self.pools and self.pools[mid].failed_final:
                self.pools[mid].forget_failure()  # a reload is a fresh chance
        await asyncio.gather(*jobs, return_exceptions=True)
        self.bus.publish("config_reloaded", None, **result)
        self._notify_capacity()
        return result

    # ================================================================ housekeeping

    async def _housekeep(self) -> None:
        last_stats = time.monotonic()
        while True:
            ttls = [t for p in self.pools.values() if (t := p.ttl_s) is not None]
            tick = max(0.05, min([1.0, *(t / 4 for t in ttls)]))
            await asyncio.sleep(tick)
            now = time.time()
            for pool in list(self.pools.values()):
                ttl = pool.ttl_s
                if (ttl is not None and pool.has_ready and pool.idle and not pool.draining
                        and now - pool.last_used >= ttl):
                    why = "ttl_s" if pool.keep_alive_s is None else "keep_alive"
                    self._background(self._unload_idle(pool, f"idle for {ttl:g} s ({why})"),
                                     f"ttl {pool.spec.id}")
            if time.monotonic() - last_stats >= _STATS_EVERY_S:
                last_stats = time.monotonic()
                for pool in self.pools.values():
                    for inst in pool.instances:
                        if inst.state is InstanceState.READY:
                            self._background(inst.fetch_stats(), "stats")

    # ================================================================ views

    def snapshot(self) -> list[dict[str, Any]]:
        return views.snapshot(self.pools.values())

    def describe(self, pool: ModelPool) -> dict[str, Any]:
        return views.describe(pool, created=int(self.started_at))


def _input_param(msg: wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest) -> str:
    """The OpenAI body field that held this request's input, for error messages."""
    if isinstance(msg, wire.EmbedRequest):
        return "input"
    if isinstance(msg, wire.TokenizeRequest):
        return "content" if msg.text is not None else "tokens"
    return "messages" if msg.messages is not None else "prompt"
