"""Speculative decoding inside the batch loop: n-gram drafts verified in the step's one decode.

A model with ``speculative = "ngram"`` drafts, for each generating slot, the tokens that
followed the latest earlier occurrence of its last few tokens (prompt lookup: the slot's
own prompt and output, no second model). ``Speculator`` is the step feature (``StepFeature``,
worker/slots.py; listed only when the model speculates, and every slot joins it): its
``write_decodes`` puts every generating slot's pending token at the start of the batch,
followed by that slot's draft when it has one; every one of those positions gets logits.
After the decode the slot's own sampler draws
position after position (``draws``, on the sampling threads): the token drawn after the
pending one, then, while each drawn token equals the draft token at that position, the
next one. Every emitted token is the sampler's draw from the target model's logits given
the tokens before it, which are exactly the tokens emitted before it: for greedy chains
the target's top choice (the standard acceptance rule), for sampling chains exact
speculative sampling with a point-mass draft (accept x with probability p(x), else a draw
from p without x: drawing y ~ p and keeping it is both at once). Grammar, penalties and
the RNG see one draw per emitted token, as without speculation, so a grammar slot may
draft too: a draft token the grammar forbids is simply never drawn. ``taken`` (``settle``) removes the
rejected tail from the KV cache (``llama_memory_seq_rm``) and from ``slot.cached``.

A slot without a draft decodes one token as before, so speculation never holds back the
others. How long a draft is worth it (``cost.best_length``): the j-th draft token is
accepted with probability r^j (r: the slot's recent per-token acceptance, a decayed count)
and costs the target ``token_cost`` of a one-token step (measured as the worker runs: about
0.3-0.5 on a CPU, where a decode's time grows with its tokens; far less on a GPU), plus, with a
draft model, its own ``draft_cost`` (measured too: worker/speculation/cost.py); a draft token is
sent while its expected tokens per cost beat the step's without it (0: no draft). So with
many slots only confident drafts are sent, and a draft model as slow as the model itself
drafts hardly at all. A slot whose drafts do not pay (or keep failing) probes again with a
short draft after a pause that doubles each time the probe fails or still does not pay.

Sliding-window attention (Gemma 3): the window's cells may be reused by llama.cpp once no
position of their sequence needs them, judged from the sequence's newest position before
the ubatch. A model with speculation runs with a unified KV cache (worker/model.py), whose
batches are split in order, and this module keeps all generating tokens of a step inside
the first ubatch, so a rolled-back draft never cost a cell the next positions need;
``settle`` checks that with ``llama_memory_seq_pos_min`` (``window_broken`` counts misses).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import llama_cpp as ll
import numpy as np
import numpy.typing as npt

from corral import wire
from corral.worker.model import LoadedModel
from corral.worker.batch import Batch
from corral.worker.sampling.pool import Drawn
from corral.worker.slots import Job, Slot, StepFeature
from corral.worker.speculation.cost import StepCosts, best_length
from corral.worker.speculation.state import PAUSE_STEPS, SlotSpec
from corral.worker.media.prompt import kv_pos

__all__ = ["Speculator", "SlotSpec", "find_draft", "NGRAM_MAX", "NGRAM_MIN", "PAUSE_STEPS"]

log = logging.getLogger("corral.worker.speculation.speculator")

NGRAM_MAX = 4  # the longest suffix looked up
NGRAM_MIN = 2  # the shortest
FAILS_BEFORE_PAUSE = 3  # drafts in a row with nothing accepted
MAX_PAUSE = 256
RECHECK_STEPS = 1024  # slot-steps between probes while the costs say no draft can pay
# priors of a draft token's cost to the target in one-token steps, until measured (cost.py)
CPU_TOKEN_COST = 0.35  # no GPU layers (measured on 2 cores, Gemma 270M)
GPU_TOKEN_COST = 0.1  # with GPU layers (a decode of a few tokens costs about one)
_DECAY = 0.8  # the acceptance counts' decay per verified draft


def find_draft(history: npt.NDArray[np.int32], length: int, n_max: int = NGRAM_MAX,
               n_min: int = NGRAM_MIN) -> list[int]:
    """Up to ``length`` tokens that followed the latest earlier occurrence of the last
    ``n`` tokens of ``history``, for the longest ``n`` in ``n_min..n_max`` that occurs."""
    h, size = history, len(history)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        key = h[size - n:]
        hit = h[: size - n] == key[0]  # starts s < size - n: the key itself is not a match
        for j in range(1, n):
            hit &= h[j: size - n + j] == key[j]
        found = np.flatnonzero(hit)
        if len(found):
            start = int(found[-1]) + n
            draft = [int(t) for t in h[start: start + length]]
            cut = next((i for i, t in enumerate(draft) if t < 0), len(draft))  # never an image's pseudo-id
            return draft[:cut]
    return []


class Speculator(StepFeature):
    """The engine's drafts and their bookkeeping; one per engine (a step feature when ``mode``
    is not "off"). ``m``: the model (None only in tests of the bookkeeping), ``is_eog``: the
    tokenizer's end-of-generation test."""

    name = "speculation"
    undoable = True  # an aborted decode can be undone (the drafts were only in the batch: preempt/urgent.py)

    def __init__(self, s: wire.WorkerSettings, n_ubatch: int, gpu_layers: int = 0, *, m: LoadedModel | None = None,
                 is_eog: Callable[[int], bool] = lambda t: False) -> None:
        self.mode = s.speculative
        self.m = m
        self.is_eog = is_eog
        self.costs = StepCosts(GPU_TOKEN_COST if gpu_layers else CPU_TOKEN_COST)  # measured (cost.py)
        self._timing: tuple[Batch, int, float] | None = None  # this step's batch, tokens, end of fill
        self._rechecked = 0  # gen_steps at the last probe made while no draft could pay
        self.draft_max = s.draft_max
        self.draft_min = min(s.draft_min, s.draft_max)
        self.room = n_ubatch  # every generating token of a step stays in the first ubatch
        self.drafted = 0  # draft tokens verified
        self.accepted = 0
        self.gen_steps = 0  # slot-steps that drew tokens
        self.window_broken = 0  # rollbacks after which the sliding window missed a cell (should stay 0)

    def admitted(self, slot: Slot, job: Job) -> bool:
        self.start(slot, job.req)
        return True  # every slot: its steps are counted and timed (cost.py) even when it does not draft

    def write_decodes(self, b: Batch, slots: list[Slot]) -> tuple[int, list[tuple[Slot, int]]]:
        assert self.m is not None
        return self.fill(b, slots, self.m)

    def taken(self, slot: Slot, job: Job, drawn: list[Drawn]) -> None:
        assert self.m is not None
        self.settle(slot, drawn, self.m, job.tokens)

    def start(self, slot: Slot, req: wire.GenerateRequest) -> None:
        """A request takes the slot (after reasoning's ``admitted``: earlier in the list). A slot whose
        thinking is split (``slot.reasoning``) does not draft: a forced close, or the grammar
        taking over at the answer, would come in the middle of a draft drawn by the sampler
        before it."""
        want = slot.reasoning is None and (True if req.speculative is None else req.speculative)
        slot.spec = SlotSpec(on=self.mode != "off" and want, cap=self.draft_max)

    def fill(self, b: Batch, slots: list[Slot], m: LoadedModel) -> tuple[int, list[tuple[Slot, int]]]:
        """Write every generating slot's pending token, and its draft, at the batch's start;
        the batch size so far and (slot, batch index of its pending token)."""
        gen = [s for s in slots if s.job is not None and s.pending >= 0]
        n = 0
        outputs: list[tuple[Slot, int]] = []
        for slot, draft in zip(gen, self._drafts(gen, min(b.cap, self.room) - len(gen), m)):
            st = slot.spec
            st.draft = draft
            st.base = len(slot.cached)
            at = kv_pos(slot.job.tokens, st.base) if slot.job is not None else st.base  # after M-RoPE media: less (media/prompt.py)
            for k, tok in enumerate([slot.pending, *st.draft]):
                b.token[n + k] = tok
                b.pos[n + k] = at + k
                b.seq[n + k] = slot.index
                b.logits[n + k] = 1
            outputs.append((slot, n))
            slot.cached.append(slot.pending)
            slot.cached.extend(st.draft)
            slot.pending = -1
            n += 1 + len(st.draft)
        self._timing = (b, n, time.perf_counter()) if n else None
        return n, outputs

    def _drafts(self, gen: list[Slot], room: int, m: LoadedModel) -> list[list[int]]:
        """Each generating slot's draft, ``room`` tokens in all at most: n-gram lookups
        (a draft model's in worker/speculation/draft.py)."""
        out: list[list[int]] = []
        for slot in gen:
            length = self._length(slot, slot.spec, room, m, len(gen))
            hist = np.fromiter(slot.cached, dtype=np.int32, count=len(slot.cached)) if length else None
            draft = [] if hist is None else find_draft(np.append(hist, np.int32(slot.pending)), length)
            out.append(draft if len(draft) >= self.draft_min else [])
            room -= len(out[-1])
        return out

    def _length(self, slot: Slot, st: SlotSpec, room: int, m: LoadedModel, n_gen: int) -> int:
        """How long a draft the slot may send this step (0: none)."""
        if not st.on:
            return 0
        if st.pause > 0:
            st.pause -= 1
            return 0
        st.n_gen = n_gen
        pays = self._pays(st, n_gen)
        st.probing = pays < self.draft_min
        if st.probing and self._hopeless(n_gen):  # not even a draft always accepted would pay
            if self.gen_steps - self._rechecked < RECHECK_STEPS:
                return 0  # no probe: it would measure only what its decodes cost (a draft model's catch-up)
            self._rechecked = self.gen_steps  # now and then one probe measures the costs again
        if st.probing:  # a probe now, then a pause (doubling while probes fail or do not pay)
            pays = self.draft_min
            st.pause, st.pause_len = st.pause_len, min(MAX_PAUSE, st.pause_len * 2)
        length = min(st.cap, pays, room, slot.max_tokens - slot.n_gen - 1, m.n_ctx_slot - len(slot.cached) - 1)
        return length if length >= self.draft_min else 0

    def _pays(self, st: SlotSpec, n_gen: int) -> int:
        """The longest draft whose every token pays (cost.py)."""
        return best_length(st.hits / st.tries, n_gen, self.costs.token_cost, self.costs.draft_cost, self.draft_max)

    def _hopeless(self, n_gen: int) -> bool:
        c = self.costs
        return best_length(1.0, n_gen, c.token_cost, c.draft_cost, self.draft_max) < self.draft_min

    def _time_step(self) -> None:
        """At the step's first settle: its decode and draws' time, for a batch of generating
        tokens only (a prompt chunk in it would be counted as a draft token)."""
        timing, self._timing = self._timing, None
        if timing is not None and timing[0].batch.n_tokens == timing[1]:
            self.costs.target(timing[1], time.perf_counter() - timing[2])

    def draws(self, slot: Slot, first: int, draw: Callable[[int], Drawn]) -> list[Drawn] | None:
        """On a sampling thread: the slot's draws from batch index ``first`` on, one per
        position while the drawn token confirms the draft (one draw without a draft)."""
        draft = slot.spec.draft
        ends_on_eog, is_eog = not slot.ignore_eos, self.is_eog
        out: list[Drawn] = []
        for j in range(len(draft) + 1):
            d = draw(first + j)
            out.append(d)
            if d.error is not None or d.token is None or (ends_on_eog and is_eog(d.token)):
                break
            if j == len(draft) or d.token != draft[j]:
                break
        return out

    def settle(self, slot: Slot, drawn: list[Drawn], m: LoadedModel, prompt: Sequence[int] = ()) -> None:
        """After the slot's tokens were taken: counters, the rejected tail out of the KV
        cache (cut by position: ``prompt``, the request's tokens, may hold M-RoPE images), the
        slot's draft length and pause."""
        self.gen_steps += 1
        self._time_step()
        st = slot.spec
        draft, st.draft = st.draft, []
        if not draft:
            return
        k = 0
        while k < len(draft) and k < len(drawn) and drawn[k].token == draft[k]:
            k += 1
        self.drafted += len(draft)
        self.accepted += k
        st.hits = st.hits * _DECAY + k
        st.tries = st.tries * _DECAY + k + (1 if k < len(draft) else 0)
        keep = st.base + 1 + k
        if len(slot.cached) > keep:  # (a failed slot's cache is already cleared)
            at = kv_pos(prompt, keep)  # the position of entry ``keep`` (media/prompt.py)
            ll.llama_memory_seq_rm(m.memory, slot.index, at, -1)  # partial removal: always done for a KV cache
            del slot.cached[keep:]
            if m.n_swa > 0 and slot.cached and \
                    ll.llama_memory_seq_pos_min(m.memory, slot.index) > max(0, at - m.n_swa):
                self.window_broken += 1
                log.warning("slot %d: the sliding window lost cells after a rollback", slot.index)
        if k == 0:
            st.fails += 1
            st.cap = max(self.draft_min, st.cap // 2)
            if st.fails >= FAILS_BEFORE_PAUSE:
                st.pause, st.pause_len, st.fails = st.pause_len, min(MAX_PAUSE, st.pause_len * 2), 0
        else:
            st.fails = 0
            if not st.probing or self._pays(st, st.n_gen) >= self.draft_min:  # else the pause stands
                st.pause, st.pause_len = 0, PAUSE_STEPS
            if k == len(draft):
                st.cap = min(self.draft_max, st.cap * 2)
