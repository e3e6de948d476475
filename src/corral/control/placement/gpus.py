"""GPUs on the router side: the device inventory, the per-device budget, placement.

Inventory: a probe (``WORKER_COMMAND --list-devices``, a short child process that asks
llama.cpp's device registry, honouring the worker's test hook ``CORRAL_FAKE_DEVICES``),
run once, lazily and off the event loop, cached per process (and per command and
visible-devices environment). When it found no GPU, the first unpinned worker that
reports GPUs in ``ModelInfo.devices`` supplies them. No GPU: nothing here applies and
admission behaves as without this module.

Budget of GPU ``k`` (its ordinal among the GPUs, as ``CUDA_VISIBLE_DEVICES`` counts):
what the probe saw free, less ``[server] gpu_memory_margin``, capped by
``gpu_memory_budget[k]`` when given. An instance's use of its GPUs: the worker's fit
plan once reported (``FitPlan.devices``: each GPU's share; with one GPU
``FitPlan.device_bytes``; the main model's layers only) plus what that plan left room for,
before that the estimate made with the worker's own math
(``corral.fit.plan.device_needs``: weights of GPU layers + KV + compute on empty devices,
the layers split over several GPUs as llama.cpp splits them; a file that is not readable
GGUF counts its file size, split by the GPUs' free memory). Both count, beside the layers,
a draft model's need (``corral.fit.draft``) and, on the first GPU, the vision projector
and the LoRA adapters (their files' sizes: ``ModelSpec.first_gpu_bytes``).

Placement: instances of a model without ``devices`` go, one by one, to the GPU with the
most free budget that holds their need (each then starts pinned to it: its
``devices=[k]``); a model with ``devices`` is charged its share on each of them, and
every one must have room. When one lacks it, ``place`` says which GPUs eviction could
free enough on (``Shortage``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from corral import wire
from corral.units import fmt_bytes
from corral.config.file import ServerConfig
from corral.control.placement.gpu_slot import GpuSlot
from corral.errors import LoadFailed
from corral.fit.draft import draft_needs
from corral.fit.layout import GGUFError, ModelLayout, read_layout
from corral.fit.plan import device_needs
from corral.fit.split import router_split, split_by_weights
from corral.model.settings import VISIBLE_DEVICES_VARS

if TYPE_CHECKING:
    from corral.control.scheduling.pool import ModelPool

__all__ = ["Shortage", "GpuBudget", "probe_devices", "device_use"]

log = logging.getLogger("corral.gpus")

_PROBE_TIMEOUT_S = 60.0
_ENV_KEYS = ("CORRAL_FAKE_DEVICES", *VISIBLE_DEVICES_VARS)
_probed: dict[tuple[str, ...], list[wire.DeviceInfo]] = {}


@dataclass(frozen=True, slots=True)
class Shortage:
    """No GPU has room: the best one's numbers, and the GPUs where evicting idle models
    would make enough room (empty: waiting is all that can help)."""

    device: str
    need_bytes: int
    free_bytes: int
    budget_bytes: int
    helpful: frozenset[int] = field(default_factory=frozenset)


def probe_devices(command: list[str]) -> list[wire.DeviceInfo]:
    """``command --list-devices``'s JSON (every device; [] when the probe fails)."""
    try:
        out = subprocess.run([*command, "--list-devices"], capture_output=True, timeout=_PROBE_TIMEOUT_S,
                             check=True, stdin=subprocess.DEVNULL)
        return msgspec.json.decode(out.stdout.strip() or b"[]", type=list[wire.DeviceInfo])
    except (OSError, subprocess.SubprocessError, msgspec.DecodeError) as exc:
        log.warning("device probe %s --list-devices failed (%s); assuming no GPU", " ".join(command), exc)
        return []


@functools.lru_cache(maxsize=64)
def _layout(path: str, size: int, mtime_ns: int) -> ModelLayout | None:
    try:
        return read_layout(path)
    except (GGUFError, OSError, ValueError):
        return None


def _read_layout(path: Path) -> ModelLayout:
    """``read_layout`` through the cache above (GGUFError where the file is not a layout)."""
    st = path.stat()
    layout = _layout(str(path), st.st_size, st.st_mtime_ns)
    if layout is None:
        raise GGUFError(f"{path.name}: no model layout")
    return layout


def _need(pool: ModelPool, budgets: list[int], free: list[int], gpus: Sequence[wire.DeviceInfo] = ()) -> list[int]:
    """One instance's estimated need on each of the GPUs with these whole ``budgets`` and
    ``free`` memory (blocking: reads the file); ``gpus``: those GPUs (a head too large for
    the last one stays on the host: ``ModelLayout.on_devices``). A file that is not GGUF: its
    size, split as the layers would be (``router_split``)."""
    path = Path(pool.spec.path)
    try:
        st = path.stat()
    except OSError:
        return [0] * len(budgets)
    # the vision projector and LoRA adapters sit on the first GPU (llama.cpp's main device):
    # the layers plan around them there
    proj = pool.spec.first_gpu_bytes() if budgets else 0
    budgets = [max(0, b - proj) if k == 0 else b for k, b in enumerate(budgets)]
    free = [max(0, f - proj) if k == 0 else f for k, f in enumerate(free)]
    layout = _layout(str(path), st.st_size, st.st_mtime_ns)
    if layout is None:
        own = split_by_weights(st.st_size, router_split(pool.spec, budgets, free) or free)
    else:
        own = device_needs(layout.on_devices(gpus), pool.spec, budgets=budgets, free=free)
    draft = draft_needs(pool.spec, path, budgets=budgets, free=free, read=_read_layout)  # speculative = "draft": its model too
    return [a + b + (proj if k == 0 else 0) for k, (a, b) in enumerate(zip(own, draft))]


def _gpus(devices: Iterable[wire.DeviceInfo]) -> list[wire.DeviceInfo]:
    return [d for d in devices if d.kind == "gpu"]


def _plan_shares(fit: wire.FitPlan, seen: list[str]) -> list[tuple[int, int]]:
    """(index among the GPUs the worker saw, bytes) of a reported plan."""
    if fit.devices:
        return [(d.index, d.bytes) for d in fit.devices]
    return [(seen.index(fit.device) if fit.device in seen else 0, fit.device_bytes)]


def _fitted(pool: ModelPool, fit: wire.FitPlan, seen: list[str]) -> list[tuple[int, int]]:
    """``_plan_shares`` with, where it put layers on GPUs, what it left room for beside them."""
    shares = _plan_shares(fit, seen)
    if fit.n_gpu_layers == 0:
        return shares
    return [(k, b + x) for (k, b), x in zip(shares, _beside(pool, len(shares)))]


def _beside(pool: ModelPool, n: int) -> list[int]:
    """What an instance with GPU layers holds on each of its ``n`` GPUs beside its fit plan
    (which covers the main model's layers only): the projector and adapters on the first,
    the draft model's need (as estimated before the start: the worker's plan left that room)."""
    draft = draft_needs(pool.spec, pool.spec.path, budgets=[1 << 50] * n, read=_read_layout)
    first = pool.spec.first_gpu_bytes()
    return [d + (first if k == 0 else 0) for k, d in enumerate(draft)]


def device_use(pool: ModelPool) -> dict[int, int]:
    """Per GPU: what ``pool``'s live instances take there (the worker's fit plan, each GPU
    its share, with what its plan left room for beside it: ``_beside``; else the estimate).
    An instance not placed by admission that saw every GPU counts its plan on the GPUs it
    planned for."""
    out: dict[int, int] = {}
    for i in pool.live():
        fit = i.info.fit if i.info is not None else None
        seen = [d.name for d in _gpus(i.info.devices)] if i.info is not None else []
        shares: list[tuple[int, int]]
        if i.gpu is not None and i.gpu.devices:
            pinned = i.gpu.devices  # the worker's GPU j is the router's GPU pinned[j]
            if fit is not None:
                shares = [(pinned[j], b) for j, b in _fitted(pool, fit, seen) if j < len(pinned)]
            else:
                shares = list(zip(pinned, i.gpu.needs))
        elif fit is not None and pool.spec.devices is None:
            if not fit.devices and fit.device not in seen:
                continue
            shares = _fitted(pool, fit, seen)
        else:
            continue
        for k, b in shares:
            out[k] = out.get(k, 0) + b
    return out


class GpuBudget:
    def __init__(self, command: Callable[[], list[str]], server: Callable[[], ServerConfig]) -> None:
        self._command = command  # the worker's argv prefix (the probe adds --list-devices)
        self._server = server
        self._inventory: list[wire.DeviceInfo] | None = None
        self._host: int | None = None  # the probe's CPU device: the host's available memory then
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ inventory

    async def inventory(self) -> list[wire.DeviceInfo]:
        """The GPUs (probed once per process and environment)."""
        if self._inventory is None:
            async with self._lock:
                if self._inventory is None:
                    command = self._command()
                    key = (*command, *(os.environ.get(k, "\0") for k in _ENV_KEYS))
                    if key not in _probed:
                        _probed[key] = await asyncio.to_thread(probe_devices, command)
                    self._inventory = _gpus(_probed[key])
                    self._host = next((d.free_bytes for d in _probed[key] if d.kind == "cpu"), None)
                    log.info("GPUs: %s", ", ".join(f"{d.name} ({d.free_bytes} B free)" for d in self._inventory)
                             or "none")
        return self._inventory

    def learn(self, pools: Iterable[ModelPool]) -> None:
        """No GPU from the probe: take them from a worker that saw every device."""
        if self._inventory:
            return
        for pool in pools:
            for inst in pool.instances:
                if inst.info is not None and inst.gpu is None and pool.spec.devices is None:
                    gpus = _gpus(inst.info.devices)
                    if gpus:
                        self._inventory = gpus
                        return

    @property
    def host_bytes(self) -> int | None:
        """The host memory the probe saw available (its CPU device; None before the probe or
        where it lists none)."""
        return self._host

    @property
    def known(self) -> list[wire.DeviceInfo]:
        return self._inventory or []

    def budgets(self) -> list[int]:
        srv = self._server()
        caps = srv.gpu_memory_budget
        out = []
        for k, d in enumerate(self.known):
            b = max(0, d.free_bytes - srv.gpu_memory_margin)
            out.append(min(b, caps[k]) if k < len(caps) else b)
        return out

    # ------------------------------------------------------------------ need and use

    def uses_gpu(self, pool: ModelPool) -> bool:
        return bool(self.known) and pool.spec.n_gpu_layers != 0 and pool.spec.devices != []

    async def need(self, pool: ModelPool) -> list[int]:
        """One instance's estimated need on each of its pinned GPUs (unpinned: one GPU, as
        on the largest budget); ``LoadFailed`` when a GPU could never hold its share, or
        when ``devices`` names a GPU this server does not see."""
        budgets = self.budgets()
        pinned = pool.spec.devices
        if not budgets:
            return []
        self._check_pins(pool)
        if pinned is not None:
            if not pinned:
                return []
            ks = list(pinned)
        else:
            ks = [max(range(len(budgets)), key=lambda k: budgets[k])]
        tops = [budgets[k] for k in ks]
        needs = await asyncio.to_thread(_need, pool, tops, [self.known[k].free_bytes for k in ks],
                                        [self.known[k] for k in ks])
        for k, n, top in zip(ks, needs, tops):
            if n > top:
                where = f"GPU {k} ({self.known[k].name})"
                raise LoadFailed(
                    f"model {pool.spec.id!r} needs about {fmt_bytes(n)} of GPU memory on {where}"
                    f"{'' if pinned else ', the largest GPU'} (n_gpu_layers="
                    f"{pool.spec.n_gpu_layers}, ctx_len={pool.spec.ctx_len}) but {where} has a budget of "
                    f"{fmt_bytes(top)} (free memory less gpu_memory_margin): lower n_gpu_layers or ctx_len, or "
                    "use n_gpu_layers = \"auto\"")
        return needs

    def _check_pins(self, pool: ModelPool) -> None:
        spec = pool.spec
        seen = ", ".join(f"{k} ({d.name})" for k, d in enumerate(self.known))
        missing = [k for k in spec.devices or [] if k >= len(self.known)]
        if missing:
            raise LoadFailed(
                f"model {spec.id!r} is pinned to GPU {', '.join(map(str, missing))} (devices = {spec.devices}) but "
                f"this server sees {len(self.known)} GPU(s): {seen}. GPU numbers count the GPUs the server sees "
                "(after its own CUDA_VISIBLE_DEVICES)")

    def used(self, pools: Iterable[ModelPool]) -> list[int]:
        used = [0] * len(self.known)
        for p in pools:
            for k, b in device_use(p).items():
                if k < len(used):
                    used[k] += b
        return used

    # ------------------------------------------------------------------ placement

    def place(self, pool: ModelPool, needs: list[int], others: list[ModelPool]) -> list[GpuSlot] | Shortage:
        """A slot per instance of ``pool``, or why none fits (``others``: the occupying pools;
        ``needs``: from ``need``, one per pinned GPU, else one)."""
        budgets = self.budgets()
        free = [b - u for b, u in zip(budgets, self.used(others))]
        spare = list(free)  # with every evictable model gone
        for p in others:
            if p.evictable:
                for k, b in device_use(p).items():
                    if k < len(spare):
                        spare[k] += b
        n = pool.spec.instances
        pinned = pool.spec.devices
        margin = self._server().gpu_memory_margin
        if pinned is not None:
            if not needs or len(needs) != len(pinned):
                return [GpuSlot(list(pinned), [0] * len(pinned)) for _ in range(n)]  # GPUs not in the inventory
            short = [(k, b * n) for k, b in zip(pinned, needs) if free[k] < b * n]
            if not short:
                split = router_split(pool.spec, [budgets[k] for k in pinned], [self.known[k].free_bytes for k in pinned])
                return [GpuSlot(list(pinned), list(needs), [free[k] - b * j for k, b in zip(pinned, needs)], margin,
                                split) for j in range(n)]
            # evicting helps only when it makes room on every GPU that lacks it
            helpful = frozenset(k for k, _ in short) if all(spare[k] >= b for k, b in short) else frozenset()
            k, b = short[0]
            return self._short(k, b, free, budgets, helpful)
        need = needs[0] if needs else 0
        slots: list[GpuSlot] = []
        for _ in range(n):
            best = max(range(len(free)), key=lambda j: free[j])
            if free[best] < need:
                helpful = frozenset(j for j in range(len(spare)) if spare[j] >= need)
                return self._short(best, need, free, budgets, helpful)
            slots.append(GpuSlot([best], [need], [free[best]], margin))
            free[best] -= need
        return slots

    def _short(self, k: int, need: int, free: list[int], budgets: list[int], helpful: frozenset[int]) -> Shortage:
        return Shortage(device=f"GPU {k} ({self.known[k].name})", need_bytes=need, free_bytes=max(0, free[k]),
                        budget_bytes=budgets[k], helpful=helpful)

    def describe(self, pools: Iterable[ModelPool]) -> list[dict[str, object]]:
        """Each GPU, its budget and what is placed on it (GET /models)."""
        used = self.used(p for p in pools if p.occupies)
        return [{"index": k, "name": d.name, "free_bytes_at_start": d.free_bytes, "total_bytes": d.total_bytes,
                 "budget_bytes": b, "used_bytes": used[k]} for k, (d, b) in enumerate(zip(self.known, self.budgets()))]
