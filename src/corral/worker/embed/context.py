"""A generative model's embedding context: a second llama.cpp context on the same weights
in the same worker (never a second copy of the weights), with ``embeddings`` on and the
model's pooling (``pooling`` setting, else mean). Created on the first embedding request.

Its size: ``n_batch`` cells (at most one slot's context), one micro-batch (a pooled input is
whole in one), so an input has at most ``n_batch`` tokens, as llama-server's ``-ub``. Its
memory is counted in the model's from then on (each ``Stats.kv_bytes``): the KV cache
llama.cpp logged allocating, plus its output buffer at its largest (llama.cpp outputs
every token of an embedding batch, logits included: ``n_batch * (n_vocab + n_embd)``
floats)."""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp as ll

from corral import wire
from corral.worker.llama_context import ContextFailed, context_params, open_context
from corral.worker.model import LoadedModel

__all__ = ["POOLING_TYPES", "EmbedContext", "open_embed_context"]


@dataclass
class EmbedContext:
    """A llama.cpp context that pools: its sequences, batch and per-input limit."""

    ctx: ll.llama_context_p
    memory: ll.llama_memory_t
    n_batch: int  # tokens per decode (one micro-batch: a pooled input must be whole in one)
    n_seq: int  # sequences per decode
    limit: int  # tokens per input
    pooling: int
    n_out: int  # floats per pooled output (n_embd; n_cls_out with rank pooling)
    kv_bytes: int = 0  # a second context's KV and output buffer (0: the model's own context, counted)

POOLING_TYPES = {"none": ll.LLAMA_POOLING_TYPE_NONE, "mean": ll.LLAMA_POOLING_TYPE_MEAN,
                 "cls": ll.LLAMA_POOLING_TYPE_CLS, "last": ll.LLAMA_POOLING_TYPE_LAST,
                 "rank": ll.LLAMA_POOLING_TYPE_RANK}
_MAX_SEQ = 8  # inputs per decode


def open_embed_context(m: LoadedModel, s: wire.WorkerSettings) -> EmbedContext:
    pooling = POOLING_TYPES[s.pooling] if s.pooling not in (None, "none") else ll.LLAMA_POOLING_TYPE_MEAN
    n = min(m.n_ctx_slot, m.n_batch)
    # a pooled input is whole in one micro-batch; the inputs of one decode share the cells
    p = context_params(s, n_ctx=n, n_batch=n, n_ubatch=n, n_seq_max=min(m.n_slots, _MAX_SEQ), threads=m.threads,
                       threads_batch=m.threads_batch, embeddings=True, pooling_type=pooling, kv_unified=True,
                       swa_full=False)
    try:
        ctx, buffers = open_context(m.model, p)
    except ContextFailed as exc:
        raise RuntimeError(f"llama.cpp could not create an embedding context of {n} cells: {exc}") from None
    kv = sum(b.bytes for b in buffers if b.kind == "kv")
    n_embd = ll.llama_model_n_embd(m.model)
    outputs = n * (m.n_vocab + n_embd) * 4
    m.extra_contexts.append(ctx)  # freed with the model
    return EmbedContext(ctx, ll.llama_get_memory(ctx), n, p.n_seq_max, n, ll.llama_pooling_type(ctx), n_embd,
                        kv_bytes=kv + outputs)
