"""The prompt cache on the wire (re-exported by ``corral.wire``): where a worker keeps its
saved prefixes on disk, the frame that asks it to write them, and what it reports.

    router                                   worker
      | -- WorkerSettings.prompt_cache_disk ->|  (at spawn: the dir, the caps)
      |            ... requests ...           |
      | -- PersistCache(max_bytes, timeout_s)>|  (an unload for any reason but a crash:
      | -- Shutdown ------------------------->|   written before Shutdown is read)

Details: docs/internals/prompt-cache.md.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["PromptCacheDisk", "PersistCache", "PromptCacheStats"]


class PromptCacheDisk(msgspec.Struct, frozen=True, kw_only=True):
    """The on-disk prompt cache of a worker (``[server] state_dir``/prompt-cache)."""

    dir: str  # the prompt-cache directory; the worker writes only under it
    max_bytes: Annotated[int, Meta(ge=0)]  # all models' files together ([server] prompt_cache_disk)
    write_bytes: Annotated[int, Meta(ge=0)]  # written per unload at most ([server] prompt_cache_write)
    write_s: Annotated[float, Meta(ge=0)] = 3.0  # a write stops after this ([server] prompt_cache_write_s)


class PersistCache(msgspec.Struct, frozen=True, tag="persist_cache", kw_only=True):
    """Write the most valuable prefixes (and the slots' current ones) to disk now, up to
    ``max_bytes`` (None: ``PromptCacheDisk.write_bytes``) and for at most ``timeout_s`` (and never
    longer than ``write_s``). No answer: the router sends ``Shutdown`` next, read after the write."""

    max_bytes: Annotated[int, Meta(ge=0)] | None = None
    timeout_s: Annotated[float, Meta(ge=0)] | None = None


class PromptCacheStats(msgspec.Struct, frozen=True, kw_only=True):
    """One worker's prompt cache (``Stats.prompt_cache``): counts since the worker started."""

    hits: int = 0  # admissions served by a restored entry (RAM or disk)
    disk_hits: int = 0  # of them, read from disk
    misses: int = 0  # admissions that found no better entry than the slot's own prefix
    saves: int = 0  # prefixes saved to RAM
    restored_tokens: int = 0  # prompt tokens restored instead of prefilled
    saved_ms: float = 0.0  # estimated prefill time saved, less the restores' time
    save_ms: float = 0.0  # time spent saving to RAM (the engine's thread: stalls the step)
    ram_entries: int = 0
    ram_bytes: int = 0
    ram_capacity: int = 0
    disk_entries: int = 0  # this model's files (its identity key) on disk
    disk_bytes: int = 0
    refused_files: int = 0  # corrupt, truncated or foreign files dropped
