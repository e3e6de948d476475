"""A fake transport: instance and pool logic without a process.

``FakeSpawner`` implements ``corral.control.transport.link.Spawner``; each spawn makes a
``FakeLink`` (a ``WorkerLink``) that the test plays the worker of, by hand. What the
router writes is decoded into ``link.sent``; what the test makes the "worker" say goes
through ``WorkerLink.receive`` as encoded frames (``link.say``), the path a real
worker's bytes take. Like a local worker's, its end is reported after the call that
caused it (``kill``, a ``Shutdown``), from the event loop.

The fake worker process (fake_worker.py) stays for integration: this is for tests
where a process is not the point (state machine, slots, routing, router errors).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from pathlib import Path
from typing import Any

from corral import wire
from corral.control.catalog import ModelSpec
from corral.control.instance.instance import Instance, Timeouts
from corral.control.instance.restart import RestartPolicy
from corral.control.scheduling.pool import ModelPool
from corral.control.transport.link import LinkExit, LinkOwner, Placement, WorkerLink
from corral.events import EventBus
from corral.children.exits import describe_exit
from corral.model.settings import ModelSettings
from testkit.model_settings import TEST_CTX_LEN, TEST_N_PARALLEL

_pids = itertools.count(90_000)


def model_info(settings: wire.WorkerSettings, **kw: Any) -> wire.ModelInfo:
    fields: dict[str, Any] = dict(
        description="fake", n_params=1, n_vocab=10, n_ctx_train=settings.ctx_len, n_ctx=settings.ctx_len,
        n_ctx_slot=settings.ctx_len // settings.n_parallel, n_slots=settings.n_parallel, n_embd=4,
        embedding=settings.embedding, has_chat_template=False, model_bytes=1000, kv_bytes=100,
        rss_bytes=5000, gpu_layers=0, load_ms=1.0)
    fields.update(kw)
    return wire.ModelInfo(**fields)


def finished(request_id: str, n: int = 1, reason: wire.FinishReason = "stop") -> wire.Finished:
    return wire.Finished(request_id, reason, wire.Usage(1, n), wire.Timings(1.0, 1.0, 1.0, 1.0))


class _Channel(asyncio.WriteTransport):
    """The router's end of the channel: frames written are decoded and handed over."""

    def __init__(self, link: FakeLink) -> None:
        super().__init__()
        self._link = link
        self._decoder = wire.FrameDecoder()
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        for body in self._decoder.feed(bytes(data)):
            self._link.got(wire.decode_to_worker(body))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True


class FakeLink(WorkerLink):
    """One fake worker. ``exit_on_shutdown``: it exits (code 0) when told to shut down."""

    def __init__(self, owner: LinkOwner, settings: wire.WorkerSettings, *, exit_on_shutdown: bool = True) -> None:
        super().__init__(owner)
        self.settings = settings
        self.pid = next(_pids)
        self.sent: list[wire.ToWorker] = []
        self.killed = False
        self.terminated = False
        self.exit_on_shutdown = exit_on_shutdown
        self._transport = _Channel(self)

    # ------------------------------------------------------------ WorkerLink

    @property
    def placement(self) -> Placement:
        return Placement(pid=self.pid)

    def terminate(self) -> None:
        self.terminated = True
        self._end_soon(-signal.SIGTERM)

    def kill(self) -> None:
        if self.exit is None:
            self.killed = True
            self._end_soon(-signal.SIGKILL)

    # ------------------------------------------------------------ the test plays the worker

    def got(self, msg: wire.ToWorker) -> None:
        self.sent.append(msg)
        if isinstance(msg, wire.Shutdown) and self.exit_on_shutdown:
            self._end_soon(0)

    def say(self, *msgs: wire.FromWorker) -> None:
        """The worker sends ``msgs`` (one read of the channel)."""
        self.receive(b"".join(wire.encode(m) for m in msgs))

    def ready(self, **info: Any) -> None:
        """Loading, then Ready (``info``: ModelInfo fields to change)."""
        self.say(wire.Loading(self.pid), wire.Ready(self.pid, model_info(self.settings, **info)))

    def requests(self) -> list[wire.GenerateRequest | wire.EmbedRequest | wire.TokenizeRequest]:
        """The requests the router sent, in order."""
        return [m for m in self.sent if isinstance(m, (wire.GenerateRequest, wire.EmbedRequest,
                                                       wire.TokenizeRequest))]

    def aborted(self) -> list[str]:
        return [m.id for m in self.sent if isinstance(m, wire.Abort)]

    def end(self, code: int | None) -> None:
        """The worker exits now: its channel closes, then its exit is reported."""
        if self.exit is not None:
            return
        if self._transport is not None:
            self._transport.close()
        self.closed()
        self.exited(LinkExit(code, f"worker {describe_exit(code)}"))

    def _end_soon(self, code: int) -> None:
        asyncio.get_running_loop().call_soon(self.end, code)


class FakeSpawner:
    """Makes ``FakeLink``s. ``ready``: each worker says Loading and Ready right after its
    spawn; ``fail``: errors the next spawns raise instead (one each, in order)."""

    def __init__(self, *, ready: bool = True, exit_on_shutdown: bool = True) -> None:
        self.auto_ready = ready
        self.exit_on_shutdown = exit_on_shutdown
        self.fail: list[OSError] = []
        self.links: list[FakeLink] = []
        self.settings: list[wire.WorkerSettings] = []
        self.on_spawn: list[Any] = []  # callables run at each spawn (what a test looks at then)
        self._spawned: asyncio.Queue[FakeLink] = asyncio.Queue()

    async def spawn(self, settings: wire.WorkerSettings, owner: LinkOwner) -> FakeLink:
        self.settings.append(settings)
        for hook in self.on_spawn:
            hook(settings)
        await asyncio.sleep(0)  # a real spawn awaits the process
        if self.fail:
            raise self.fail.pop(0)
        link = FakeLink(owner, settings, exit_on_shutdown=self.exit_on_shutdown)
        self.links.append(link)
        self._spawned.put_nowait(link)
        if self.auto_ready:
            asyncio.get_running_loop().call_soon(link.ready)
        return link

    async def next_link(self, timeout_s: float = 5.0) -> FakeLink:
        """The next link spawned (in spawn order)."""
        return await asyncio.wait_for(self._spawned.get(), timeout_s)


def spec(model_id: str = "m", **settings: Any) -> ModelSpec:
    """A model whose file does not matter (nothing reads it)."""
    settings = {"ctx_len": TEST_CTX_LEN, "n_parallel": TEST_N_PARALLEL, **settings}
    return ModelSpec.make(model_id, Path(f"/nonexistent/{model_id}.gguf"), ModelSettings(**settings),
                          source="config")


def fake_pool(spawner: FakeSpawner, model: ModelSpec | None = None, *, bus: EventBus | None = None,
              timeouts: Timeouts | None = None, **policy: Any) -> ModelPool:
    """A ``ModelPool`` whose instances spawn on ``spawner``, wired as the plane wires them
    (transitions to ``on_instance_change``, freed slots to ``release``)."""
    events = bus or EventBus()

    def make_instance(pool: ModelPool, index: int) -> Instance:
        return Instance(pool.spec, index, spawner=spawner, timeouts=timeouts or Timeouts(5.0, 1.0),
                        policy=RestartPolicy(**{"backoff_s": 0.01, **policy}), bus=events, threads=1,
                        on_change=pool.on_instance_change, on_slot_free=pool.release)

    return ModelPool(model or spec(), make_instance=make_instance, on_capacity=lambda: None)
