"""The step's batch: a ``llama_batch`` over buffers the worker owns (below the slots: the
engine's step, speculation's drafts, preemption's recomputes and a draft model write it)."""

from __future__ import annotations

import ctypes

import llama_cpp as ll

__all__ = ["Batch"]


class Batch:
    """A llama_batch over buffers we own: flat arrays written with plain indexing."""

    def __init__(self, n: int) -> None:
        self.cap = n
        self.token = (ll.llama_token * n)()
        self.pos = (ll.llama_pos * n)()
        self.n_seq_id = (ctypes.c_int32 * n)(*([1] * n))
        self.seq = (ll.llama_seq_id * n)()
        self.seq_ptr = (ctypes.POINTER(ll.llama_seq_id) * n)()
        base = ctypes.addressof(self.seq)
        size = ctypes.sizeof(ll.llama_seq_id)
        for i in range(n):
            self.seq_ptr[i] = ctypes.cast(base + i * size, ctypes.POINTER(ll.llama_seq_id))
        self.logits = (ctypes.c_int8 * n)()
        self.batch = ll.llama_batch(
            token=ctypes.cast(self.token, ctypes.POINTER(ll.llama_token)), embd=None,
            pos=ctypes.cast(self.pos, ctypes.POINTER(ll.llama_pos)),
            n_seq_id=ctypes.cast(self.n_seq_id, ctypes.POINTER(ctypes.c_int32)),
            seq_id=ctypes.cast(self.seq_ptr, ctypes.POINTER(ctypes.POINTER(ll.llama_seq_id))),
            logits=ctypes.cast(self.logits, ctypes.POINTER(ctypes.c_int8)))
        self.n = 0

    def decode(self, ctx: ll.llama_context_p, n: int) -> int:
        """``llama_decode`` of the first ``n`` tokens written (the step's plain decode)."""
        self.batch.n_tokens = n
        return int(ll.llama_decode(ctx, self.batch))
