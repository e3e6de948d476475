"""The router's part of the prompt cache (docs/internals/prompt-cache.md): each worker is told
where its files go (``[server] state_dir``/prompt-cache, the caps), every stop asks it to
write them (``WorkerLink.shutdown`` sends ``wire.PersistCache`` before ``Shutdown``), and
``GET /models`` and ``/metrics`` show what the workers report (``wire.PromptCacheStats``)."""

from __future__ import annotations

from typing import Any

import msgspec

from corral import wire

from corral.state import cache_files
from corral.config.file import ServerConfig
from corral.control.transport.link import LinkOwner, Spawner, WorkerLink
from corral.state.paths import prompt_cache_dir

__all__ = ["disk_settings", "CachingSpawner", "with_prompt_cache", "view", "disk_usage"]


def disk_settings(srv: ServerConfig) -> wire.PromptCacheDisk | None:
    """What a worker needs to keep prefixes on disk; None: ``prompt_cache_disk = 0``."""
    if srv.prompt_cache_disk <= 0:
        return None
    return wire.PromptCacheDisk(dir=str(prompt_cache_dir(srv.state_dir)), max_bytes=srv.prompt_cache_disk,
                                write_bytes=srv.prompt_cache_write, write_s=srv.prompt_cache_write_s)


class CachingSpawner:
    """A spawner whose workers get ``prompt_cache_disk`` in their settings."""

    def __init__(self, inner: Spawner, disk: wire.PromptCacheDisk) -> None:
        self.inner = inner
        self.disk = disk

    async def spawn(self, settings: wire.WorkerSettings, owner: LinkOwner) -> WorkerLink:
        return await self.inner.spawn(msgspec.structs.replace(settings, prompt_cache_disk=self.disk), owner)


def with_prompt_cache(spawner: Spawner, srv: ServerConfig) -> Spawner:
    disk = disk_settings(srv)
    return spawner if disk is None else CachingSpawner(spawner, disk)


def view(stats: Any) -> dict[str, Any] | None:
    """An instance's prompt cache as ``GET /models`` shows it (None: no stats, or no cache)."""
    pc = getattr(stats, "prompt_cache", None)
    if pc is None:
        return None
    out: dict[str, Any] = msgspec.structs.asdict(pc)
    looked = pc.hits + pc.misses
    out["hit_rate"] = pc.hits / looked if looked else None
    return out


def disk_usage(srv: ServerConfig) -> tuple[int, int]:
    """(files, bytes) of the whole prompt cache on disk (all models)."""
    return cache_files.total_bytes(prompt_cache_dir(srv.state_dir))
