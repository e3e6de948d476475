"""Urgent starts: a request that takes the slot a preemption just freed starts at once
(docs/internals/fair-share.md, "The first token: urgent starts").

The router sends ``Preempt(victim)`` and, right behind it, the waiting key's request that
gets the victim's slot. Measured (docs/benchmarks.md, fairness), that request's first token
waited for two things that have nothing to do with it: the rest of the step the worker was
running when it arrived (a step of four decodes, or longer with another prompt in it), and
other prompts prefilled in its own step. So:

- **the running decode is aborted**: the reader thread, reading the request that follows a
  ``Preempt``, raises a flag that llama.cpp's abort callback reads between two graph nodes.
  ``llama_decode`` returns 2 and llama.cpp removes the aborted batch's cells; the step puts
  every slot back as it was before the batch was filled (``cached``, ``prompt_pos``,
  ``pending``) and returns, the engine loop reads the Preempt and the request, and the next
  step decodes the same tokens with the new prompt. Nothing was drawn, so no stream
  changes: each slot's next token is drawn from its own next decode, as it would have been.
- **its prompt goes first**: while an urgent request's prompt prefills, no other prompt
  chunk joins the batch, and the step that takes its last chunk decodes nothing else:
  the generating slots' tokens (and their logits: a row over the whole vocabulary each)
  wait for the next step. So its first token comes from a step the size of its prompt, as
  when the model is idle. The generating slots lose one step per urgent request, a prompt
  deferred waits at most as many steps as the urgent prompt has chunks, and urgent
  requests are bounded by preemption itself (one per paused sequence): nobody starves.

The callback is libc's ``strlen`` on a two-byte buffer (``b"\\x01\\0"``: length 1, true;
``b"\\0\\0"``: 0, false): a C function that reads a byte, so ggml's compute thread never
takes the GIL. It is armed only around the step's own decode (never a recompute, a restore
or a draft model's decode), and only where an abort can be undone exactly: one ubatch, no
draft model, no image in the batch. Elsewhere urgent requests still get the prefill rule.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp as ll

from corral import wire
from corral.worker import llama_context
from corral.worker.model import LoadedModel
from corral.worker.batch import Batch
from corral.worker.slots import Slot
from corral.worker.media.prompt import has_media

__all__ = ["UrgentStarts", "ABORTED", "Before", "libc_strlen"]

log = logging.getLogger("corral.worker.preempt.urgent")

ABORTED = 2  # llama_decode's code for an aborted decode
PREEMPT_GAP_S = 0.05
MAX_ABORTS_IN_A_ROW = 3  # a request read this long after a Preempt is not the one it made room for


def libc_strlen() -> int | None:
    """The address of libc's strlen (None where there is no C library to load)."""
    for name in (None, ctypes.util.find_library("c")):
        try:
            fn = ctypes.CDLL(name).strlen
        except (OSError, AttributeError, TypeError):
            continue
        return ctypes.cast(fn, ctypes.c_void_p).value
    return None


@dataclass(slots=True)
class Before:
    slot: Slot
    cached: int
    prompt_pos: int
    pending: int


def _prompting(s: Slot) -> bool:
    return s.job is not None and s.n_gen == 0 and s.prompt_pos < len(s.job.tokens)


class UrgentStarts:
    """Urgent requests: marked by the reader thread, started by the engine thread."""

    def __init__(self, m: LoadedModel, *, abort: bool = True) -> None:
        """``abort``: False where an aborted decode cannot be undone (a draft model's drafts)."""
        self.m = m
        self._lock = threading.Lock()
        self._flag = ctypes.create_string_buffer(2)  # [0]: 1 while an abort is wanted and armed
        self._armed = False
        self._unread: set[str] = set()  # urgent requests in the inbox, not taken yet
        self._preempts: list[float] = []  # reader thread: Preempts not yet followed by a request
        self.ids: set[str] = set()  # urgent requests taken (engine thread), until their prompt is in
        self.aborts = 0
        self._in_a_row = 0
        self._cb: object = None
        fn = libc_strlen() if abort else None
        if fn is not None:
            self._cb = ll.ggml_abort_callback(fn)
            ll.llama_set_abort_callback(m.ctx, self._cb, ctypes.cast(self._flag, ctypes.c_void_p))
        self.can_abort = fn is not None
        self._n_ubatch = ll.llama_n_ubatch(m.ctx)

    # ------------------------------------------------------------------ reader thread

    def put(self, inbox: queue.SimpleQueue[object], msg: object, request_id: str | None) -> None:
        """The reader thread's ``inbox.put``: a request (``request_id``) read right behind a
        ``Preempt`` is urgent (put and marked under one lock, so ``take`` never misses it)."""
        if isinstance(msg, wire.Preempt):
            self._preempts.append(time.monotonic())
        elif request_id is not None and self._preempts and not isinstance(msg, wire.RequestFailed):
            now = time.monotonic()
            self._preempts = [t for t in self._preempts if now - t < PREEMPT_GAP_S]
            if self._preempts:
                self._preempts.pop(0)
                with self._lock:
                    inbox.put(msg)
                    self._unread.add(request_id)
                    self._set()
                return
        inbox.put(msg)

    # ------------------------------------------------------------------ engine thread

    def take(self, request_id: str) -> None:
        """The engine loop took the request out of the inbox (it joins the next step)."""
        with self._lock:
            if request_id not in self._unread:
                return
            self._unread.discard(request_id)
            self._set()
        self.ids.add(request_id)

    def _set(self) -> None:  # under the lock
        self._flag[0] = b"\x01" if self._armed and self._unread else b"\x00"

    def plan(self, slots: list[Slot], live: Callable[[str], object], cap: int) -> list[Slot]:
        """The slots that fill this step's batch: while an urgent request's prompt prefills,
        the generating slots and its prompt only (no other prompt's chunks); the step that
        takes its last chunk only its prompt (its first token is not held up by the other
        slots' decodes and their logits; they decode in the next step: once per urgent
        request). ``live``: the engine's request by id (None: ended; an urgent one still
        waiting for a slot stays urgent); ``cap``: the batch's room."""
        if not self.ids:
            return slots
        prefilling: list[Slot] = []
        started: set[str] = set()
        last = 0
        for s in slots:
            job = s.job
            if job is not None and job.req.id in self.ids:
                if s.n_gen == 0 and s.prompt_pos < len(job.tokens):
                    prefilling.append(s)
                    if not has_media(job.tokens):
                        last += len(job.tokens) - s.prompt_pos
                else:
                    started.add(job.req.id)
        self.ids = {i for i in self.ids if live(i) is not None and i not in started}
        if not prefilling:
            return slots
        if 0 < last <= cap and not any(has_media(s.job.tokens) for s in prefilling if s.job):
            return prefilling
        return [s for s in slots if s in prefilling or not _prompting(s)]  # a generating slot writes no chunk

    def before(self, slots: list[Slot]) -> list[Before]:
        """What the step's fill changes, to put back after an abort."""
        return [Before(s, len(s.cached), s.prompt_pos, s.pending) for s in slots if s.job is not None]

    def decode(self, b: Batch, n: int, before: list[Before], outputs: list[tuple[Slot, int]],
               echo_chunks: list[Any]) -> int:
        """The step's ``llama_decode`` of ``n`` tokens (``before``: its slots as they were),
        aborted for an urgent request where that can be undone exactly (one ubatch, no
        image in it). An aborted batch is undone, ``outputs`` and ``echo_chunks`` emptied
        (nothing to draw), and 0 returned: the next step decodes the same tokens."""
        b.batch.n_tokens = n
        arm = self.can_abort and n <= self._n_ubatch and not any(has_media(x.slot.job.tokens) for x in before if x.slot.job)
        if arm:
            with self._lock:
                self._armed = True
                self._set()
            llama_context.aborting[0] = True
        try:
            rc = ll.llama_decode(self.m.ctx, b.batch)
        finally:
            if arm:
                with self._lock:
                    self._armed = False
                    self._set()
                llama_context.aborting[0] = False
        if rc == ABORTED and arm:
            self.aborts += 1
            self._in_a_row += 1
            if self._in_a_row > MAX_ABORTS_IN_A_ROW:  # never a livelock, whatever the reason
                log.warning("%d aborted decodes in a row: no more aborts for %s", self._in_a_row, self._unread)
                with self._lock:
                    self._unread.clear()
                    self._set()
            for x in before:
                ll.llama_memory_seq_rm(self.m.memory, x.slot.index, x.cached, -1)
                del x.slot.cached[x.cached:]
                x.slot.prompt_pos, x.slot.pending = x.prompt_pos, x.pending
            outputs.clear()
            echo_chunks.clear()
            return 0
        elif arm or rc == 0:
            self._in_a_row = 0
        return int(rc)

