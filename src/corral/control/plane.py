"""The control plane: the one object the HTTP layer talks to (``app.state.router``).

A small facade over three parts that share the catalog and the pools (one
``ModelPool`` per model):

- ``Admission`` (admission.py): the lock, making room, eviction, the capacity wait;
  the one place that starts workers;
- ``CatalogSync`` (catalog_sync.py): models added, removed, restarted, reloaded;
- ``Housekeeper`` (housekeeping.py): idle TTL, worker stats.

It never imports llama_cpp and never touches a GPU: every model instance is a worker
that a ``Spawner`` (``corral.control.transport.link``; local processes by default) starts.

Life of a request (``generate``/``embed``): the API resolves the name (id or alias, the
key's visibility: ``pool``) once -> ``Dispatch`` (dispatch.py) makes sure the model is
loaded (autoload through admission) -> takes a free slot or queues for one -> writes the
request to that worker -> returns the ``RequestStream`` the API reads from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from corral import wire
from corral.config.file import CorralConfig
from corral.control import generation_defaults, views
from corral.control.keys import cache_tenant
from corral.control.keys.access import Access
from corral.control.placement.admission import Admission
from corral.control.placement.gpus import GpuBudget
from corral.control.conversations import Conversations
from corral.control.catalog import Catalog, ModelSpec, default_threads
from corral.control.catalog_sync import CatalogSync, Embedded
from corral.control.dispatch import Dispatch
from corral.control.prompt_cache import with_prompt_cache
from corral.events import EventBus
from corral.control.housekeeping import Housekeeper
from corral.control.instance.instance import Instance, InstanceState, Timeouts, Transition
from corral.control.transport.link import Spawner
from corral.control.transport.local import LocalSpawner
from corral.control.metrics import Metrics
from corral.control.scheduling.pool import ModelPool
from corral.control.instance.restart import RestartPolicy
from corral.control.keys.ring import current_caller, detached_context
from corral.control.stream import RequestStream
from corral.errors import Conflict, CorralError, ModelNotFound, ModelUnloaded, Unavailable

if TYPE_CHECKING:
    from corral.control.transport.ray.cluster import RayCluster
    from corral.store.local import ModelStore

__all__ = ["ControlPlane"]

VARIANT_SOURCES = frozenset({"config", "nitro", "created", "preset"})  # the models ``serving`` may share

log = logging.getLogger("corral.plane")


class ControlPlane:
    def __init__(self, config: CorralConfig, *, bus: EventBus | None = None,
                 metrics: Metrics | None = None, store: ModelStore | None = None,
                 config_loader: Callable[[], CorralConfig] | None = None,
                 embedded: Embedded | None = None, spawner: Spawner | None = None) -> None:
        self.config = config
        self.bus = bus or EventBus()
        self.metrics = metrics or Metrics()
        self.store = store
        self._config_loader = config_loader
        self.catalog = Catalog()
        self.pools: dict[str, ModelPool] = {}
        self._tmp_logs: tempfile.TemporaryDirectory[str] | None = None
        self._local = LocalSpawner(self._log_dir(config), config.server.worker_command)
        self.spawner: Spawner = spawner or self._local
        self.ray: RayCluster | None = None  # a RayCluster when [server] ray_address is set (Ray is imported only then)
        if spawner is None and config.server.ray_address:
            from corral.control.transport.ray.cluster import RayCluster  # imported only with Ray in use
            self.ray = RayCluster.from_config(config.server, self.bus, self._log_dir(config))
            self.spawner = self.ray
        self._tasks: set[asyncio.Task[None]] = set()
        self._housekeeper: asyncio.Task[None] | None = None
        self.admission = Admission(self.pools, lambda: self.config.server, self._background,
                                   node_room=self._node_room if self.ray is not None else None,
                                   gpus=GpuBudget(lambda: self._local.worker_command, lambda: self.config.server)
                                   if self.spawner is self._local else None,
                                   serving=self.serving)
        self.sync = CatalogSync(catalog=self.catalog, pools=self.pools, bus=self.bus,
                                admission=self.admission, make_pool=self._make_pool,
                                load_soon=self._load_soon, store=store, embedded=embedded)
        self.started_at = time.time()
        self.metrics.watch(self.snapshot)
        self.access = Access(config, self.bus, self.metrics)  # keys, limits, usage (control/keys/access.py)
        self.dispatch = Dispatch(self.pools, lambda: self.config.server, self.access, self.admission, self.ray,
                                 self._background)
        # streams that outlive their client; the plane outlives a reload, so they do too
        self.conversations = Conversations(lambda: self.config.server, self.bus)

    # ================================================================ lifecycle

    def _log_dir(self, cfg: CorralConfig) -> Path:
        if cfg.server.log_dir is not None:
            return cfg.server.log_dir
        if self._tmp_logs is None:
            self._tmp_logs = tempfile.TemporaryDirectory(prefix="corral-logs-")
        return Path(self._tmp_logs.name)

    async def start(self) -> None:
        if self.ray is not None:
            await self.ray.start()
        for spec in await self.sync.specs(self.config):
            self.sync.add(spec, announce=False)
        housekeeper = Housekeeper(self.pools, self.admission, self._background)
        self._housekeeper = asyncio.get_running_loop().create_task(housekeeper.run(), name="housekeeper")
        started: list[tuple[Any, ...]] = []  # a variant of a model loaded here loads nothing (keys hold dicts)
        for pool in self.pools.values():
            if pool.spec.load_on_startup:
                key = pool.spec.load_key()
                if key in started and self._may_share(pool):
                    continue
                started.append(key)
                self._load_soon(pool)

    async def close(self) -> None:
        """Stop every worker (graceful, then the process group is killed)."""
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        for t in list(self._tasks):
            t.cancel()
        self.conversations.close()
        for pool in self.pools.values():
            pool.fail_waiters(Unavailable("the server is shutting down"))
        await asyncio.gather(*(p.stop("router shutting down") for p in self.pools.values()),
                             return_exceptions=True)
        for pool in self.pools.values():
            pool.discard()
        if self.ray is not None:
            await self.ray.close()  # the bridge ends: Ray removes the actors it owned
        if self._tmp_logs is not None:
            with contextlib.suppress(OSError):
                self._tmp_logs.cleanup()
        await asyncio.to_thread(self.access.close)  # the last usage flushed

    def _node_room(self, pool: ModelPool) -> str | None:
        """On Ray: the per-node budget (a load that fits no node evicts idle models)."""
        assert self.ray is not None
        return self.ray.room_for(pool.spec.worker_settings(0, pool.spec.threads), pool.spec.instances)

    def _make_pool(self, spec: ModelSpec) -> ModelPool:
        return ModelPool(spec, make_instance=self._make_instance, on_capacity=self.admission.notify_capacity,
                         server=lambda: self.config.server)

    def _make_instance(self, pool: ModelPool, index: int) -> Instance:
        spec, srv = pool.spec, self.config.server
        threads = spec.threads
        if threads is None and self.ray is None:  # on Ray: 1 CPU asked, the worker adapts to its node
            threads = default_threads(spec, srv.max_loaded_models, len(self.pools))

        def on_change(inst: Instance, tr: Transition) -> None:
            pool.on_instance_change(inst, tr)
            self._observe(inst, tr)

        return Instance(spec, index, spawner=with_prompt_cache(self.spawner, srv), bus=self.bus, threads=threads,
                        timeouts=Timeouts(srv.load_timeout_s, srv.stop_grace_s),
                        policy=RestartPolicy(max_restarts=srv.max_restarts,
                                             backoff_s=srv.restart_backoff_s),
                        on_change=on_change, on_slot_free=pool.release)

    def _observe(self, inst: Instance, tr: Transition) -> None:
        m, i = inst.spec.id, str(inst.index)
        if tr.new is InstanceState.READY:
            self.metrics.loads.labels(m, i).inc()
            if inst.last_load_s is not None:
                self.metrics.load_duration.labels(m, i).observe(inst.last_load_s)
        elif tr.new is InstanceState.FAILED:
            self.metrics.failures.labels(m, i).inc()
        elif tr.new is InstanceState.STARTING and tr.restart:  # performed, not scheduled
            self.metrics.restarts.labels(m, i).inc()

    def _background(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        # the plane's own work, even when a request started it: no caller (every model visible)
        task = asyncio.get_running_loop().create_task(coro, name=name, context=detached_context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _load_soon(self, pool: ModelPool) -> None:
        if pool.spec.pull is not None and not pool.spec.path.exists():  # never loads '' (llama.cpp's regression)
            log.warning("%s: load_on_startup skipped: its file is pulled from %s when a request first needs it",
                        pool.spec.id, pool.spec.pull)
            return

        async def load() -> None:
            try:
                await self.load(pool)
            except Exception as exc:  # noqa: BLE001 - one model's failed preload must not stop the others (logged)
                log.warning("loading %s failed: %s", pool.spec.id, exc)

        self._background(load(), f"load {pool.spec.id}")

    # ================================================================ requests

    def resolve(self, name: str) -> str:
        return self.pool(name).spec.id

    def pool(self, name: str) -> ModelPool:
        """The model ``name`` names; ModelNotFound also when the request's key may not use it.
        A request resolves its name here once, where it enters, and passes the pool down."""
        pool = self.pools.get(self.catalog.resolve_id(name))
        if pool is None:
            raise ModelNotFound(f"model {name!r} not found", param="model")
        self.access.check_visible(name, pool)
        return pool

    def serving(self, pool: ModelPool) -> ModelPool:
        """The pool whose instances serve ``pool``'s requests: its own, or, while it holds none,
        a loaded (or loading) model's equal in all a load fixes (``ModelSpec.load_key``: the
        file, context, GPU layers, projector, cache types...): ``pool`` is then a variant of
        it, served with no second load (its generation defaults and plain prompt go with
        each request). [models] tables, ids made at run time (Nitro's loadmodel, Ollama's
        create) and a preset's sections are variants so; a model that sets ``own_instances``
        runs on its own workers only (part of its load_key: none other shares its workers)."""
        if not self._may_share(pool):
            return pool
        key = pool.spec.load_key()
        for other in self.pools.values():
            if other is not pool and other.occupies and other.spec.load_key() == key:
                return other
        return pool

    def variant_of(self, pool: ModelPool) -> str | None:
        """The id of the model whose instances serve ``pool`` (``serving``), None where that is
        ``pool`` itself or a model the request's key may not see (its id is not told)."""
        runs_on = self.serving(pool)
        return runs_on.spec.id if runs_on is not pool and self.access.visible(runs_on.spec) else None

    def status(self, pool: ModelPool) -> str:
        """``pool``'s status as the listings show it: a variant's is the status of the model
        serving it (loaded or loading: it answers with no load of its own), else its own."""
        return self.serving(pool).status()

    def _may_share(self, pool: ModelPool) -> bool:
        """``pool`` may run on another's instances (it holds none of its own, it may be a variant)."""
        return not pool.occupies and pool.spec.source in VARIANT_SOURCES and not pool.spec.own_instances

    def visible_pools(self) -> list[ModelPool]:
        """The models the request's key may use (every model outside a request)."""
        return [p for p in self.pools.values() if self.access.visible(p.spec)]

    async def generate(self, pool: ModelPool, msg: wire.GenerateRequest, prefix: str | None,
                       cache_salt: str | None = None) -> RequestStream:  # tenant: control/keys/cache_tenant.py
        """``pool``: the model the request named, resolved once by ``pool`` (control/dispatch.py);
        its generation defaults fill what the request left out (control/generation_defaults.py).
        A variant (``serving``) runs on the model that serves it, under its own id."""
        msg = generation_defaults.apply(pool.spec, msg)
        runs_on = self.serving(pool)
        if self._may_share(pool):  # a variant now, or once its load is decided (Admission.load)
            # its own plain prompt and adapter scales go with it: on a worker of its own they
            # are that worker's (the same request), on another's they make it this model
            msg = generation_defaults.with_prompt_format(pool.spec, msg)
            if msg.lora is None and pool.spec.lora:  # the variant's own adapter scales
                msg = msgspec.structs.replace(msg, lora=[
                    wire.LoraScale(i, a.scale if a.model is None else 0.0) for i, a in enumerate(pool.spec.lora)])
        msg = cache_tenant.with_tenant(msg, current_caller(), cache_salt)
        return await self.dispatch.submit(runs_on, msg, cache_tenant.affinity_prefix(msg, prefix),
                                          as_model=pool.spec.id)

    async def embed(self, pool: ModelPool, msg: wire.EmbedRequest) -> RequestStream:
        return await self.dispatch.submit(self.serving(pool), msg, None, as_model=pool.spec.id)

    async def tokenize(self, pool: ModelPool, msg: wire.TokenizeRequest) -> RequestStream:
        msg = generation_defaults.with_system(pool.spec, msg)
        if self._may_share(pool):  # a variant renders a chat with its own plain prompt (as in generate)
            msg = generation_defaults.with_prompt_format(pool.spec, msg)
        return await self.dispatch.tokenize(self.serving(pool), msg, as_model=pool.spec.id)

    def keep_alive(self, pool: ModelPool, seconds: float | None) -> None:
        self.dispatch.keep_alive(pool, seconds)

    def end_requests(self, exc: CorralError) -> None:
        """The server is stopping (api/shutdown.py): every request running or queued ends with ``exc``."""
        self.dispatch.end_all(exc)

    # ================================================================ load / unload

    def is_loaded(self, model_id: str) -> bool:
        """Loaded or loading (it holds, or will hold, memory)."""
        pool = self.pools.get(model_id)
        return pool is not None and pool.occupies

    async def load(self, pool: ModelPool) -> None:
        """Explicit load: also retries a model that failed for good (fresh instances).
        409 when another request unloaded it before it was ready (the later call wins).
        ``pool``: what the request resolved its name to (``pool``), once, where it entered."""
        try:
            await self.admission.load(pool)  # a variant: the model that serves it (admission decides)
        except ModelUnloaded as exc:
            raise Conflict(f"{exc.message}: another request unloaded it before it was ready",
                           param="model") from None

    async def unload(self, pool: ModelPool, reason: str = "unloaded by request") -> bool:
        """Let running requests finish (up to drain_timeout_s), then stop the workers.
        Requests queued for it go back to the top: with autoload they load it again, without
        they get 400 model_not_loaded. False when it was not loaded."""
        was = pool.occupies or bool(pool.instances)
        await self.admission.unload(pool, reason, drain=True)
        return was

    # ================================================================ catalog changes

    async def add_model(self, spec: ModelSpec, *, replace: bool = False) -> ModelPool:
        """A model learned at run time (Nitro loadmodel, a finished pull)."""
        return await self.sync.add_model(spec, replace=replace)

    async def on_download_finished(self, model_id: str, path: Path) -> None:
        """DownloadManager callback: the pulled model can be served now."""
        await self.sync.on_download_finished(model_id, path, self.config.inherited_settings())

    async def remove_model(self, model_id: str) -> None:
        """Unload (if needed) and forget a model (e.g. its file was deleted)."""
        await self.sync.remove_model(model_id)

    def add_alias(self, name: str, alias: str) -> str:
        """Make ``alias`` another name of model ``name`` (Ollama's copy); returns the id."""
        return self.sync.add_alias(self.resolve(name), alias)

    async def reload(self, config: CorralConfig | None = None) -> dict[str, list[str]]:
        """Re-read the config (and models_dir). A bad config changes nothing (ConfigError)."""
        if config is None:  # no loader: the same config, models_dir rescanned
            config = self._config_loader() if self._config_loader is not None else self.config
        self.config = config
        self.access.reconfigure(config)
        self._local.log_dir = self._log_dir(config)
        self._local.worker_command = config.server.worker_command or self._local.worker_command
        return await self.sync.reload(config)

    def reload_soon(self, why: str) -> asyncio.Task[None]:
        """Reload in the background (SIGHUP); the outcome is logged."""
        async def run() -> None:
            self.access.keys.reload(why)  # the keys file, even if the config turns out bad
            try:
                result = await self.reload()
                log.info("%s reload: %s", why, result)
            except CorralError as exc:
                log.error("%s reload failed, nothing changed: %s", why, exc.message)
            except Exception:  # never an unretrieved task exception
                log.exception("%s reload failed, nothing changed", why)

        return self._background(run(), f"reload ({why})")

    @property
    def background_tasks(self) -> frozenset[asyncio.Task[None]]:
        """Tasks the plane started and keeps (loads, unloads, reloads, stats)."""
        return frozenset(self._tasks)

    # ================================================================ views

    def snapshot(self) -> list[dict[str, Any]]:
        return views.snapshot(self.pools.values())

    def describe(self, pool: ModelPool) -> dict[str, Any]:
        return views.describe(pool, created=int(self.started_at), status=self.status(pool))

