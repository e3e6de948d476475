"""Draft-model speculation (``speculative = "draft"``): a smaller GGUF with the model's
vocabulary proposes each generating slot's draft; the step's one target decode verifies it
(worker/speculation/speculator.py: the draws, the acceptance rule, the rollback, the adaptive lengths).

The draft model is loaded in the same worker with its own context: one sequence per slot
(sequence i mirrors slot i), the model's context per slot, on the model's GPUs (the worker
is pinned to them). ``DraftModel.cached[i]`` are the tokens whose KV is in sequence i; it is
brought in line with the slot's accepted tokens lazily, at the slot's next draft (the common
prefix kept, the rest removed, the missing tokens decoded without logits). Drafting is
batched over the slots: one decode of the drafting slots' pending tokens, then one decode
per further draft position with each still-drafting slot's latest draft token (the first
one also takes the tokens each sequence misses, where they fit), so a step costs the draft
model ``max(draft length)`` small decodes, not one per slot. A slot's draft
is the draft model's greedy chain; it stops where the draft's top probability falls below
``draft_p_min`` (llama-server's ``--draft-p-min``), at the length ``Speculator._length``
allows, or where a slot's draft would run out of context; one shorter than ``draft_min``
is not sent, and counts as a failed draft for the pauses (three in a row pause the slot).
The time of ``propose``'s decodes (and their top-probability checks) per slot-position
drafted, but for decodes that also catch up a long history (a new prompt, the tokens of a
pause), is the draft's cost in the length rule (``Speculator.costs.draft``,
worker/speculation/cost.py): with a draft as slow as the model itself (a self-draft on a CPU) no
length pays, and slots do not even probe but once every ``RECHECK_STEPS``.

Sliding-window draft models (Gemma 3): the context keeps one KV stream per sequence with
full-size window caches (``swa_full``), so a rolled-back draft never costs a cell; each
rollback is still checked with ``llama_memory_seq_pos_min`` and a sequence whose window
lost a cell is recomputed from its start (``DraftModel.window_resets``).

The vocabulary check at load (``vocab_mismatch``): the same number of tokens, the same
vocabulary type, BOS and EOS, and the same text for every token (llama-server allows a
difference of up to 128 tokens in number; corral wants the same vocabulary); else
``ModelLoadError`` (the ``LoadFailed`` reason).
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp as ll
import msgspec
import numpy as np

from corral import wire
from corral.fit.rows import outputs_max
from corral.fit.draft import draft_needs, draft_path, draft_settings
from corral.fit.layout import GGUFError, read_layout
from corral.fit.plan import DEFAULT_MARGIN_BYTES
from corral.worker.host.devices import logged_buffers
from corral.worker.llama_context import ContextFailed, captured, context_params, model_params, open_context
from corral.worker.model import LoadedModel, ModelLoadError, check_gguf_file, free_context_and_model, model_meta
from corral.worker.sampling.sampler import logits_at
from corral.worker.batch import Batch
from corral.worker.slots import Slot
from corral.worker.speculation.speculator import FAILS_BEFORE_PAUSE, MAX_PAUSE, Speculator

__all__ = ["DraftModel", "DraftSpeculator", "load_draft", "main_settings", "speculator", "vocab_mismatch"]

log = logging.getLogger("corral.worker.speculation.draft")



def main_settings(s: wire.WorkerSettings) -> wire.WorkerSettings:
    """The settings the main model loads with: with a draft model and ``n_gpu_layers =
    "auto"``, its plan leaves room for the draft (the router's budget less the draft's
    need on each GPU, else a margin as large as the draft's largest share)."""
    if draft_path(s, s.model_path) is None or s.n_gpu_layers != "auto":
        return s
    budgets = s.gpu_budget_bytes
    if isinstance(budgets, int):
        need = draft_needs(s, s.model_path, budgets=[budgets])[0]
        return msgspec.structs.replace(s, gpu_budget_bytes=max(0, budgets - need))
    if budgets:
        needs = draft_needs(s, s.model_path, budgets=budgets)
        return msgspec.structs.replace(s, gpu_budget_bytes=[max(0, b - n) for b, n in zip(budgets, needs)])
    need = max(draft_needs(s, s.model_path, budgets=[1 << 50]), default=0)
    margin = DEFAULT_MARGIN_BYTES if s.gpu_margin_bytes is None else s.gpu_margin_bytes
    return msgspec.structs.replace(s, gpu_margin_bytes=margin + need)


def speculator(s: wire.WorkerSettings, m: LoadedModel, is_eog: Callable[[int], bool]) -> Speculator:
    """The engine's speculator: with ``speculative = "draft"`` a ``DraftSpeculator`` over the
    draft model (loaded here; it is added to ``m.info``'s bytes); else the n-gram one (a step
    feature only when ``speculative`` is not "off": features.py). ``ModelLoadError`` (the model
    freed) when the draft cannot serve."""
    n_ubatch = ll.llama_n_ubatch(m.ctx)
    if s.speculative != "draft" or m.embedding:
        return Speculator(s, n_ubatch, m.info.gpu_layers, m=m, is_eog=is_eog)
    try:
        dm = load_draft(s, m)
    except BaseException:
        m.free()
        raise
    d = dm.info
    m.info = msgspec.structs.replace(m.info, model_bytes=m.info.model_bytes + d.model_bytes,
                                     kv_bytes=m.info.kv_bytes + d.kv_bytes, draft=d)
    return DraftSpeculator(s, m, dm, n_ubatch, is_eog)


def _draft_context(s: wire.WorkerSettings, m: LoadedModel, path: Path, model: ll.llama_model_p) -> ll.llama_context_p:
    """The draft's context (``ModelLoadError``, the draft freed, when its vocabulary is not the
    model's or the context cannot be made)."""
    try:
        why = vocab_mismatch(m.vocab, ll.llama_model_get_vocab(model))
        if why is not None:
            raise ModelLoadError(f"draft model {path}: {why}")
        n_train = ll.llama_model_n_ctx_train(model)
        n_ctx_slot = min(m.n_ctx_slot, n_train) if n_train > 0 else m.n_ctx_slot
        # a logits row a drafting slot (fit.plan counts the same); a stream per slot, with whole
        # windows: rollbacks lose no cell
        p = context_params(s, n_ctx=n_ctx_slot * m.n_slots, n_batch=m.n_batch, n_ubatch=min(m.n_batch, 512),
                           n_seq_max=m.n_slots, threads=m.threads, threads_batch=m.threads_batch,
                           n_outputs_max=outputs_max(draft_settings(s), m.n_slots), kv_unified=False, swa_full=True)
        try:
            return open_context(model, p)[0]
        except ContextFailed as exc:
            raise ModelLoadError(f"draft model: llama.cpp could not create a context of {p.n_ctx} cells for "
                                 f"{path}: {exc}") from None
    except BaseException:
        ll.llama_model_free(model)
        raise


def vocab_mismatch(target: ll.llama_vocab_p, draft: ll.llama_vocab_p) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (None: it can)."""
    nt, nd = ll.llama_vocab_n_tokens(target), ll.llama_vocab_n_tokens(draft)
    if nt != nd:
        return f"the draft model has {nd} tokens and the model {nt}: a draft model needs the model's vocabulary"
    if ll.llama_vocab_type(target) != ll.llama_vocab_type(draft):
        return "the draft model's tokenizer is of another type than the model's"
    for name, f in (("BOS", ll.llama_vocab_bos), ("EOS", ll.llama_vocab_eos)):
        if f(target) != f(draft):
            return f"the draft model's {name} token is {f(draft)}, the model's {f(target)}"
    text = ll.llama_vocab_get_text
    for i in range(nt):  # every token (~0.7 s for 262k on one core)
        if text(target, i) != text(draft, i):
            a, b = text(target, i), text(draft, i)
            return f"token {i} is {a!r} in the model but {b!r} in the draft model: not the same vocabulary"
    return None


class DraftModel:
    """The draft GGUF, its context (sequence i: slot i's tokens) and each sequence's tokens."""

    def __init__(self, model: ll.llama_model_p, ctx: ll.llama_context_p, n_ctx_slot: int, n_batch: int,
                 n_slots: int, info: wire.DraftInfo) -> None:
        self.model, self.ctx, self.info = model, ctx, info
        self.memory = ll.llama_get_memory(ctx)
        self.n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
        self.n_swa = ll.llama_model_n_swa(model)
        self.n_ctx_slot = n_ctx_slot
        self.batch = Batch(n_batch)
        self.cached: list[list[int]] = [[] for _ in range(n_slots)]
        self.window_resets = 0  # sequences recomputed after their window lost a cell (should stay 0)
        self.decodes = 0  # decodes with draft positions (catch-ups alone not counted) ...
        self.positions = 0  # ... and the slot-positions they drafted (batched: more than decodes)
        self.timed_s = 0.0  # seconds of the draft positions decoded without a long catch-up ...
        self.timed_positions = 0  # ... and their slot-positions (the draft's cost per position)

    def free(self) -> None:
        free_context_and_model(self)

    def clear(self, seq: int) -> None:
        ll.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.cached[seq] = []

    def sync(self, seq: int, tokens: list[int]) -> int:
        """Keep the longest common prefix of sequence ``seq`` and ``tokens``; its length."""
        c = self.cached[seq]
        n = min(len(c), len(tokens))
        if c[:n] != tokens[:n]:
            n = int(np.argmax(np.asarray(c[:n]) != np.asarray(tokens[:n])))
        if n < len(c):
            ll.llama_memory_seq_rm(self.memory, seq, n, -1)
            del c[n:]
            if self.n_swa > 0 and n > 0 and ll.llama_memory_seq_pos_min(self.memory, seq) > max(0, n - self.n_swa):
                self.window_resets += 1
                log.warning("draft sequence %d: the sliding window lost cells; recomputed", seq)
                self.clear(seq)
                n = 0
        return n

    def decode(self, items: list[tuple[int, int, int]], n_out: int = 0) -> int | None:
        """Decode (token, position, seq) items in batches of the context's size, logits for
        the last ``n_out`` (at most a batch: they go in the last one, with as many of the
        others as fit); their first's index in that batch, None when llama.cpp fails."""
        b = self.batch
        head, start, first = len(items) - n_out, 0, 0
        while start < len(items):
            rest = len(items) - start
            chunk = items[start: start + (rest if rest <= b.cap else min(b.cap, head - start))]
            for k, (tok, pos, seq) in enumerate(chunk):
                b.token[k], b.pos[k], b.seq[k], b.logits[k] = tok, pos, seq, 1 if start + k >= head else 0
            b.batch.n_tokens = len(chunk)
            rc = ll.llama_decode(self.ctx, b.batch)
            if rc != 0:
                log.error("draft decode failed (%d); the draft sequences are cleared", rc)
                for seq in range(len(self.cached)):
                    self.clear(seq)
                return None
            for tok, _, seq in chunk:
                self.cached[seq].append(tok)
            first = len(chunk) - n_out
            start += len(chunk)
        if n_out:
            self.decodes += 1
            self.positions += n_out
        return first

    def propose(self, slots: list[Slot], lengths: list[int], p_min: float) -> list[list[int]]:
        """Each slot's draft of at most ``lengths[k]`` tokens (slots with 0 get none): the
        missing history and the pending tokens in one decode where they fit, then a decode
        per further position."""
        drafts: list[list[int]] = [[] for _ in slots]
        active = [k for k, n in enumerate(lengths) if n > 0]
        items: list[tuple[int, int, int]] = []
        for k in active:
            slot = slots[k]
            n = self.sync(slot.index, slot.cached)
            items.extend((t, n + j, slot.index) for j, t in enumerate(slot.cached[n:]))
        items.extend((slots[k].pending, len(slots[k].cached), slots[k].index) for k in active)
        while active:
            t0, timed = time.perf_counter(), len(items) <= 2 * len(active)  # not a catch-up of many tokens
            first = self.decode(items, len(active))
            if first is None:
                return [[] for _ in slots]
            still = []
            for i, k in enumerate(active):
                x = np.asarray(logits_at(self.ctx, first + i, self.n_vocab), dtype=np.float32)
                top = int(np.argmax(x))
                if 1.0 / float(np.exp(x - x[top]).sum()) < p_min:  # the draft's top probability
                    continue
                drafts[k].append(top)
                if len(drafts[k]) < lengths[k]:
                    still.append(k)
            if timed:  # what a draft position costs (worker/speculation/cost.py): the decode and the check
                self.timed_s += time.perf_counter() - t0
                self.timed_positions += len(active)
            active = still
            items = [(drafts[k][-1], len(self.cached[slots[k].index]), slots[k].index) for k in active]
        return drafts


class DraftSpeculator(Speculator):
    """``Speculator`` whose drafts come from a draft model (``DraftModel.propose``)."""

    undoable = False  # the draft model's decodes of an aborted step already ran

    def __init__(self, s: wire.WorkerSettings, m: LoadedModel, dm: DraftModel, n_ubatch: int,
                 is_eog: Callable[[int], bool]) -> None:
        super().__init__(s, n_ubatch, m.info.gpu_layers, m=m, is_eog=is_eog)
        self.dm = dm
        self.p_min = s.draft_p_min

    def _drafts(self, gen: list[Slot], room: int, m: LoadedModel) -> list[list[int]]:
        lengths = []
        for slot in gen:
            n = self._length(slot, slot.spec, room, m, len(gen))
            n = min(n, self.dm.n_ctx_slot - len(slot.cached) - 2)  # the draft's own context may be shorter
            lengths.append(n if n >= self.draft_min else 0)
            room -= lengths[-1]
        dm, positions, seconds = self.dm, self.dm.timed_positions, self.dm.timed_s
        proposed = dm.propose(gen, lengths, self.p_min)
        self.costs.draft(dm.timed_positions - positions, dm.timed_s - seconds)  # its own cost (cost.py)
        drafts = [d if len(d) >= self.draft_min else [] for d in proposed]
        for slot, n, d in zip(gen, lengths, drafts):
            st = slot.spec
            if n and not d:  # the draft model was not sure enough: a failure for the pauses too
                st.fails += 1
                if st.fails >= FAILS_BEFORE_PAUSE:
                    st.pause, st.pause_len, st.fails = st.pause_len, min(MAX_PAUSE, st.pause_len * 2), 0
        return drafts

    def close(self) -> None:
        self.dm.free()


def load_draft(s: wire.WorkerSettings, m: LoadedModel) -> DraftModel:
    """Load the draft model for ``m`` (``ModelLoadError`` with the reason when it cannot serve)."""
    path = draft_path(s, s.model_path)
    if path is None:
        raise ModelLoadError('speculative = "draft" needs draft_model (the draft GGUF\'s path)')
    try:
        check_gguf_file(str(path))
    except ModelLoadError as exc:
        raise ModelLoadError(f"draft model: {exc}") from None
    given = s.draft_n_gpu_layers  # None: all layers where the model has GPU layers
    mparams = model_params(given if given is not None else (-1 if m.info.gpu_layers > 0 else 0))
    with captured() as lines:  # where its weights and context went ("Vulkan0 model buffer size = ...")
        model = ll.llama_model_load_from_file(str(path).encode(), mparams)
        if model:
            ctx = _draft_context(s, m, path, model)
    if not model:
        raise ModelLoadError(f"draft model: llama.cpp could not load {path}")
    n_train = ll.llama_model_n_ctx_train(model)
    n_ctx_slot = min(m.n_ctx_slot, n_train) if n_train > 0 else m.n_ctx_slot
    desc = ctypes.create_string_buffer(256)
    ll.llama_model_desc(model, desc, 256)
    try:
        layout = read_layout(path)
        kv = layout.kv_bytes_per_cell(s.cache_type_k, s.cache_type_v) * layout.n_layer * n_ctx_slot * m.n_slots
    except (GGUFError, OSError, ValueError):
        kv = 0
    info = wire.DraftInfo(path=str(path), description=desc.value.decode("utf-8", "replace") or
                          (model_meta(model, "general.name") or ""), n_params=int(ll.llama_model_n_params(model)),
                          model_bytes=int(ll.llama_model_size(model)), kv_bytes=kv,
                          gpu_layers=mparams.n_gpu_layers, n_ctx=n_ctx_slot * m.n_slots,
                          buffers=logged_buffers(lines))
    return DraftModel(model, ctx, n_ctx_slot, m.n_batch, m.n_slots, info)
