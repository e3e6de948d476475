"""Sequences' KV state in host RAM: the one store a worker keeps for its prompt cache and for
the sequences it pauses (fair-share preemption).

    state = save_seq(ctx, slot.index)                  # the slot's cells, as bytes (host copy)
    store.put("paused:req-7", tokens, state, pinned=True)
    ...
    entry = store.pop("paused:req-7")
    restore_seq(ctx, other_slot.index, entry.state)    # the same cells, under another seq id

An entry holds the KV of ``tokens`` at positions 0..len(tokens)-1 (what the slot's ``cached``
said when it was saved). Two kinds share one byte budget:

- **cache entries** (``pinned=False``): prefixes kept for reuse; evicted least recently used
  first whenever room is needed; ``longest_prefix`` finds the one that serves a prompt best.
- **pinned entries**: a paused sequence's state; never evicted to make room. A ``put`` that
  cannot find room (after evicting every cache entry) returns False and stores nothing: the
  caller drops the state and recomputes it later.

Restoring a state restores exactly what was saved. With sliding-window attention that is
only the last window's cells of the SWA layers, so a restored entry serves a prefix of
length n only while ``llama_memory_seq_pos_min`` <= max(0, n - n_swa): the caller checks that
(``slots.reuse_len``) after restoring, exactly as for a prefix left in a slot.

Single-threaded: only the engine's thread uses a worker's store.
"""

from __future__ import annotations

import ctypes
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import llama_cpp as ll

__all__ = ["KVEntry", "HostKVStore", "save_seq", "restore_seq", "common_prefix"]


def save_seq(ctx: ll.llama_context_p, seq: int) -> bytes:
    """The KV state of sequence ``seq`` (all its cells), copied to host memory."""
    size = ll.llama_state_seq_get_size(ctx, seq)
    if size <= 0:
        return b""
    buf = (ctypes.c_uint8 * size)()
    n = ll.llama_state_seq_get_data(ctx, buf, size, seq)
    return bytes(memoryview(buf)[:n])


def restore_seq(ctx: ll.llama_context_p, seq: int, state: bytes) -> bool:
    """Load ``state`` (from ``save_seq``) into sequence ``seq``, which should be empty.
    False when llama.cpp refuses it (no room in the cache, a state from another context):
    the sequence is then left empty."""
    if not state:
        return False
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    return int(ll.llama_state_seq_set_data(ctx, buf, len(state), seq)) > 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


@dataclass(eq=False)
class KVEntry:
    key: str
    tokens: tuple[int, ...]  # the KV holds these, at positions 0..len-1
    state: bytes
    pinned: bool = False
    pos_min: int = 0  # the lowest position the state holds (sliding-window layers keep the last window)
    lora: tuple[tuple[int, float], ...] = ()  # the LoRA adapter set its KV was computed under (worker/lora/adapters.py)
    tenant: str = ""  # the cache tenant whose request computed it (wire.GenerateRequest.cache_tenant)
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)

    @property
    def nbytes(self) -> int:
        return len(self.state)


class HostKVStore:
    """Bounded bytes of saved sequence states, LRU over the unpinned ones."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = max(0, capacity_bytes)
        self._entries: OrderedDict[str, KVEntry] = OrderedDict()  # oldest use first
        self.bytes_used = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def entries(self) -> Iterator[KVEntry]:
        """Every entry, least recently used first."""
        return iter(list(self._entries.values()))

    @property
    def pinned_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values() if e.pinned)

    def put(self, key: str, tokens: Sequence[int], state: bytes, *, pinned: bool = False, pos_min: int = 0,
            lora: tuple[tuple[int, float], ...] = (), tenant: str = "") -> bool:
        """Keep ``state`` under ``key`` (replacing an entry of that key), evicting least
        recently used cache entries for room; False (and nothing kept) when it cannot fit.
        ``lora``: the adapter set the state was computed under, ``tenant`` whose request computed
        it, for the caller to compare."""
        self.pop(key)
        size = len(state)
        if not state or size > self.capacity - self.pinned_bytes:
            return False
        for old in [e for e in self._entries.values() if not e.pinned]:
            if self.bytes_used + size <= self.capacity:
                break
            self._drop(old.key)
            self.evictions += 1
        if self.bytes_used + size > self.capacity:
            return False
        self._entries[key] = KVEntry(key, tuple(tokens), state, pinned, pos_min, lora=lora, tenant=tenant)
        self.bytes_used += size
        return True

    def get(self, key: str) -> KVEntry | None:
        """The entry (marked as just used), or None."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.last_used = time.monotonic()
            self._entries.move_to_end(key)
        return entry

    def pop(self, key: str) -> KVEntry | None:
        """Remove and return the entry, or None."""
        return self._drop(key)

    def longest_prefix(self, tokens: Sequence[int], *, at_least: int = 1) -> tuple[KVEntry, int] | None:
        """The cache entry (not pinned) that shares the most leading tokens with ``tokens``
        (at least ``at_least``; ties: the smallest state), and that count. Not marked used:
        call ``get`` once the caller decides to restore it."""
        best: tuple[KVEntry, int] | None = None
        for e in self._entries.values():
            if e.pinned:
                continue
            n = common_prefix(e.tokens, tokens)
            if n < at_least:
                continue
            if best is None or n > best[1] or (n == best[1] and e.nbytes < best[0].nbytes):
                best = (e, n)
        return best

    def clear(self, *, pinned: bool = False) -> None:
        """Drop every cache entry (and the pinned ones too when ``pinned``)."""
        for e in list(self._entries.values()):
            if pinned or not e.pinned:
                self._drop(e.key)

    def _drop(self, key: str) -> KVEntry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes_used -= entry.nbytes
        return entry
