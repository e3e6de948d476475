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
from corral.worker import model as model_mod
from corral.worker.devices import logged_buffers
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
    p = ll.llama_context_default_params()
    p.n_ctx = n
    p.n_batch = n
    p.n_ubatch = n  # a pooled input is whole in one micro-batch
    p.n_seq_max = min(m.n_slots, _MAX_SEQ)
    p.n_threads = m.threads
    p.n_threads_batch = m.threads_batch
    p.embeddings = True
    p.pooling_type = pooling
    p.kv_unified = True  # the inputs of one decode share the cells
    p.swa_full = False
    p.no_perf = True
    p.type_k = model_mod._GGML_TYPES[s.cache_type_k]
    p.type_v = model_mod._GGML_TYPES[s.cache_type_v]
    if s.flash_attn is not None:
        p.flash_attn_type = ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if s.flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
    before = list(model_mod._buffer_lines)
    ctx = ll.llama_init_from_model(m.model, p)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create an embedding context of {n} cells")
    after = list(model_mod._buffer_lines)
    new = after[len(before):] if after[:len(before)] == before else after
    kv = sum(b.bytes for b in logged_buffers(new) if b.kind == "kv")
    n_embd = ll.llama_model_n_embd(m.model)
    outputs = n * (m.n_vocab + n_embd) * 4
    m.extra_contexts.append(ctx)  # freed with the model
    return EmbedContext(ctx, ll.llama_get_memory(ctx), n, p.n_seq_max, n, ll.llama_pooling_type(ctx), n_embd,
                        kv_bytes=kv + outputs)
