"""The prompt cache of one worker (llama-server's --cache-ram, and its files across unloads).

The engine calls:

- ``admit(slot, job, reuse)`` when a job is about to start in ``slot`` (the free slot
  ``slots.pick_slot`` chose, whose cache serves ``reuse`` tokens): first the slot's cached
  prefix, about to be overwritten, is saved to the host-RAM store (``kv_store.HostKVStore``,
  a cache entry keyed by its tokens and the slot's cell fields, ``tenant`` and ``lora``)
  unless it is short or kept already; the slot's cell fields become the job's; then, when
  the store or the disk holds a longer valid prefix of the job's tokens, it is restored into
  the slot (``restore_seq``, then ``seq_rm`` beyond the common prefix). Returns the tokens
  the slot now serves.
- as a step feature (``StepFeature``, worker/slots.py; listed only when the cache is on):
  ``admitted`` takes part in a request with a long prefill, whose ``finished`` records the
  prefill speed, for the time-saved estimate.
- ``persist(slots, ...)`` (the router's ``PersistCache`` before an unload): the slots' current
  prefixes and the RAM entries, most recent first, written to disk (``cache_disk``).

Sliding-window models (Gemma 3): a saved state holds only the last window of the SWA layers'
cells, from ``pos_min`` on; an entry serves n tokens only while pos_min <= max(0, n - n_swa),
checked before restoring and again after it with ``llama_memory_seq_pos_min``
(``slots.reuse_len``).

The store is the worker's one host-RAM KV store: fair-share preemption keeps its paused
sequences in it too (pinned entries: ``PromptCache.store``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import llama_cpp as ll

from corral import wire

from corral.state import cache_files
from corral.state.cache_files import CacheFile
from corral.worker.cache.disk import Candidate, DiskCache, model_key
from corral.worker.cache.kv_store import HostKVStore, KVEntry, common_prefix, restore_seq, save_seq
from corral.worker.lora.state import BASE, LoraKey
from corral.worker.model import LoadedModel
from corral.worker.slots import LAST_CUT, Job, Slot, StepFeature, reuse_len
from corral.worker.media.prompt import kv_pos

__all__ = ["PromptCache", "MIN_SAVE_TOKENS", "MIN_GAIN_TOKENS"]

log = logging.getLogger("corral.worker.cache.prompt_cache")

MIN_SAVE_TOKENS = 64  # a shorter prefix is cheaper to prefill again than to keep
MIN_GAIN_TOKENS = 16  # restore only when it serves this many more tokens than the slot does


class PromptCache(StepFeature):
    name = "prompt_cache"

    def __init__(self, m: LoadedModel, settings: wire.WorkerSettings) -> None:
        self.m = m
        self.store = HostKVStore(0 if m.embedding else settings.prompt_cache_ram)
        self.enabled = not m.embedding
        self.disk: DiskCache | None = None
        cfg = settings.prompt_cache_disk
        if cfg is not None and cfg.max_bytes > 0 and self.enabled:
            try:
                self.disk = DiskCache(cfg, model_key(m, settings), settings.model_id)
            except OSError as exc:
                log.warning("prompt cache: no disk cache (%s)", exc)
        self.hits = self.disk_hits = self.misses = self.saves = self.restored = 0
        self.gain_tokens = 0  # prompt tokens not prefilled thanks to restores
        self.restore_s = self.save_s = 0.0
        self._prefill_tokens = 0  # measured prefill, for the time-saved estimate
        self._prefill_s = 0.0

    # ------------------------------------------------------------------ admission

    def admit(self, slot: Slot, job: Job, reuse: int) -> int:
        """Save what ``slot`` is about to lose, then restore a longer prefix of ``job``'s cache
        tenant and adapter set if one is kept; returns the tokens the slot serves now. The
        slot's cells are the job's tenant's and set's from here on (``pick_slot`` gave a slot
        of another one 0)."""
        tokens, tenant, now = job.tokens, job.req.cache_tenant, job.lora
        echo = job.req.echo and job.req.logprobs is not None
        was_tenant, was = slot.tenant, slot.lora
        slot.tenant, slot.lora = tenant, now
        if not self.enabled:
            return reuse
        keep = 0 if echo else reuse
        if self.store.capacity > 0 and len(slot.cached) - keep >= MIN_SAVE_TOKENS:
            self.save(slot, keep if was == now and was_tenant == tenant else 0, was, was_tenant)
        if echo or len(tokens) < MIN_SAVE_TOKENS:
            return reuse
        best = self._best(tokens, reuse + MIN_GAIN_TOKENS, now, tenant, job.tail)
        if best is None:
            self.misses += 1
            return reuse
        entry, n = best
        t0 = time.perf_counter()
        state = entry.state if isinstance(entry, KVEntry) else self._read(entry)
        if state is None:  # a damaged file, dropped: the slot is untouched
            self.misses += 1
            return reuse
        got = self._restore(slot, entry.tokens, state, n, tokens, job.tail)
        if got <= reuse:  # refused (the slot is empty now) or not whole after all
            if isinstance(entry, KVEntry):
                self.store.pop(entry.key)
            elif self.disk is not None:
                self.disk.forget(entry)
            log.warning("prompt cache: an entry of %d tokens could not be restored", len(entry.tokens))
            self.misses += 1
            return 0
        if isinstance(entry, KVEntry):
            self.store.get(entry.key)
        else:
            self.disk_hits += 1
        self.hits += 1
        self.restored += got
        self.gain_tokens += got - reuse
        self.restore_s += time.perf_counter() - t0
        return got

    def save(self, slot: Slot, keep: int, lora: LoraKey = BASE, tenant: str = "") -> bool:
        """Keep the slot's cached prefix in the RAM store (a cache entry keyed by its tokens,
        ``lora``, the adapter set its cells were computed under, and ``tenant``, the cache
        tenant whose requests computed them). The slot is about to be overwritten from ``keep`` on."""
        self._cut_to_last_prompt(slot, keep)
        tokens = tuple(slot.cached)
        key = cache_files.token_hash(tokens, lora, tenant)
        if key in self.store:
            self.store.get(key)
            return True
        t0 = time.perf_counter()
        state = save_seq(self.m.ctx, slot.index)
        pos_min = int(ll.llama_memory_seq_pos_min(self.m.memory, slot.index))
        if self.m.n_swa == 0:  # a longer entry serves every prefix of it: drop the shorter ones
            for e in self.store.entries():
                if not e.pinned and e.lora == lora and e.tenant == tenant and len(e.tokens) < len(tokens) and \
                        tokens[: len(e.tokens)] == e.tokens:
                    self.store.pop(e.key)
        ok = self.store.put(key, tokens, state, pos_min=max(0, pos_min), lora=lora, tenant=tenant)
        self.save_s += time.perf_counter() - t0
        self.saves += ok
        return ok

    def _cut_to_last_prompt(self, slot: Slot, keep: int) -> None:
        """Sliding window: a restored state holds only its last n_swa positions, so it serves
        a prompt only where that prompt extends the whole entry. Cut a free slot back to its
        last prompt less its last cut (``slots.LAST_CUT`` tokens: what the same prompt again
        decodes anew, ``Job.tail``): that entry then serves the same prompt again and every
        continuation of it (a conversation's next turn); what the answer added is lost."""
        cut = slot.prompt_pos - LAST_CUT
        if self.m.n_swa > 0 and slot.job is None and keep <= cut < len(slot.cached) and \
                ll.llama_memory_seq_rm(self.m.memory, slot.index, cut, -1):
            del slot.cached[cut:]

    def _usable(self, entry_tokens: Sequence[int], pos_min: int, tokens: Sequence[int], tail: int) -> int:
        """How many leading prompt tokens an entry serves (at most len(tokens) - tail: ``Job.tail``;
        0 where a sliding window's cells for that length are gone)."""
        n = min(common_prefix(entry_tokens, tokens), len(tokens) - tail)
        if n > 0 and self.m.n_swa > 0 and pos_min > max(0, n - self.m.n_swa):
            return 0
        return n

    def _best(self, tokens: Sequence[int], at_least: int, lora: LoraKey,
              tenant: str, tail: int) -> tuple[KVEntry | CacheFile, int] | None:
        """The entry of adapter set ``lora`` and cache tenant ``tenant`` that serves most of
        ``tokens`` (at least ``at_least``): another tenant's entries are never considered."""
        best: tuple[KVEntry | CacheFile, int] | None = None
        for e in self.store.entries():
            if not e.pinned and e.lora == lora and e.tenant == tenant and \
                    (n := self._usable(e.tokens, e.pos_min, tokens, tail)) >= at_least:
                if best is None or n > best[1]:
                    best = (e, n)
        for f in self.disk.entries() if self.disk is not None else ():
            if f.lora != lora or f.tenant != tenant:
                continue
            n = self._usable(f.tokens, f.pos_min, tokens, tail)
            if n >= at_least and (best is None or n > best[1]):  # RAM wins a tie
                best = (f, n)
        return best

    def _read(self, entry: CacheFile) -> bytes | None:
        assert self.disk is not None
        return self.disk.load(entry)

    def _restore(self, slot: Slot, entry_tokens: tuple[int, ...], state: bytes, n: int,
                 tokens: Sequence[int], tail: int) -> int:
        mem = self.m.memory
        ll.llama_memory_seq_rm(mem, slot.index, -1, -1)
        slot.cached = []
        if not restore_seq(self.m.ctx, slot.index, state):
            return 0
        slot.cached = list(entry_tokens)
        if n < len(entry_tokens):  # cut at entry n's position (after an M-RoPE image: less than n)
            if not ll.llama_memory_seq_rm(mem, slot.index, kv_pos(tokens, n), -1):
                ll.llama_memory_seq_rm(mem, slot.index, -1, -1)
                slot.cached = []
                return 0
            del slot.cached[n:]
        got = reuse_len(slot, list(tokens), self.m, tail)  # llama.cpp's own word on what is whole
        if got <= 0:
            ll.llama_memory_seq_rm(mem, slot.index, -1, -1)
            slot.cached = []
            return 0
        return got

    # ------------------------------------------------------------------ accounting

    def admitted(self, slot: Slot, job: Job) -> bool:
        return len(job.tokens) - slot.n_cached >= MIN_SAVE_TOKENS  # a prefill worth timing

    def finished(self, slot: Slot, fin: wire.Finished) -> None:
        n_eval = fin.usage.prompt_tokens - fin.usage.cached_tokens
        if n_eval >= MIN_SAVE_TOKENS and fin.timings.prompt_ms > 0:
            self._prefill_tokens += n_eval
            self._prefill_s += fin.timings.prompt_ms / 1000

    def stats(self) -> wire.PromptCacheStats:
        per_token = self._prefill_s / self._prefill_tokens if self._prefill_tokens else 0.0
        disk = self.disk
        return wire.PromptCacheStats(
            hits=self.hits, disk_hits=self.disk_hits, misses=self.misses, saves=self.saves,
            restored_tokens=self.restored,
            saved_ms=max(0.0, self.gain_tokens * per_token - self.restore_s) * 1000 if per_token else 0.0,
            save_ms=self.save_s * 1000, ram_entries=sum(1 for e in self.store.entries() if not e.pinned),
            ram_bytes=self.store.bytes_used - self.store.pinned_bytes, ram_capacity=self.store.capacity,
            disk_entries=len(disk.index) if disk is not None else 0, disk_bytes=disk.nbytes if disk is not None else 0,
            refused_files=disk.refused if disk is not None else 0)

    # ------------------------------------------------------------------ unload

    def persist(self, slots: Sequence[Slot], msg: wire.PersistCache) -> tuple[int, int]:
        """Write the slots' current prefixes and the RAM entries to disk, bounded in bytes
        (``PersistCache.max_bytes``, else ``PromptCacheDisk.write_bytes``) and in time (the
        lower of ``PersistCache.timeout_s`` and ``PromptCacheDisk.write_s``)."""
        disk = self.disk
        if disk is None:
            return 0, 0
        t0 = time.perf_counter()
        now = time.monotonic()
        cands: list[Candidate] = []
        seen: set[tuple[tuple[int, ...], LoraKey, str]] = set()
        for s in slots:
            self._cut_to_last_prompt(s, 0)  # (the worker unloads: its slots are not used again)
            if len(s.cached) >= MIN_SAVE_TOKENS:
                toks, lora = tuple(s.cached), s.lora
                pos_min = max(0, int(ll.llama_memory_seq_pos_min(self.m.memory, s.index)))
                cands.append(Candidate(toks, pos_min, save_seq(self.m.ctx, s.index), now, lora, s.tenant))
                seen.add((toks, lora, s.tenant))
        cands += [Candidate(e.tokens, e.pos_min, e.state, e.last_used, e.lora, e.tenant) for e in self.store.entries()
                  if not e.pinned and (e.tokens, e.lora, e.tenant) not in seen]
        limit = disk.cfg.write_bytes if msg.max_bytes is None else msg.max_bytes
        timeout = disk.cfg.write_s if msg.timeout_s is None else min(disk.cfg.write_s, msg.timeout_s)
        written, n_bytes = disk.persist(cands, limit, max(0.0, timeout - (time.perf_counter() - t0)))
        log.info("prompt cache: wrote %d files (%d bytes) in %.0f ms", written, n_bytes,
                 (time.perf_counter() - t0) * 1000)
        return written, n_bytes
