"""Pooled embeddings: each input in its own sequence, as many per decode as fit.

The context was created with ``embeddings=True`` and the model's pooling type (mean
pooling for generative models, which have none). Vectors are L2-normalized on request.
The KV cache is cleared before each decode: embedding inputs share nothing.
"""

from __future__ import annotations

import ctypes
import logging
import math

import llama_cpp as ll

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.model import LoadedModel
from corral.worker.tokens import Tokenizer

__all__ = ["embed_batch", "embed_request"]

log = logging.getLogger("corral.worker.embed")


def embed_batch(
    m: LoadedModel, tok: Tokenizer, inputs: list[str], normalize: bool
) -> tuple[list[list[float]], int]:
    """Return (one vector per input, total prompt tokens)."""
    if not inputs:
        raise RequestRejected("invalid_request", "input must not be empty")
    limit = min(m.n_ctx_slot, m.n_batch)
    encoded: list[list[int]] = []
    for i, text in enumerate(inputs):
        toks = tok.tokenize(text, add_special=True)
        if not toks:
            raise RequestRejected("invalid_request", f"input[{i}] is empty")
        if len(toks) > limit:
            raise RequestRejected(
                "context_length_exceeded",
                f"input[{i}] has {len(toks)} tokens, but this model embeds at most {limit}",
            )
        encoded.append(toks)
    n_embd = ll.llama_model_n_embd(m.model)
    batch = ll.llama_batch_init(m.n_batch, 0, 1)
    out: list[list[float]] = [[] for _ in inputs]
    try:
        i = 0
        while i < len(encoded):
            # Fill one batch with whole inputs: at most n_slots sequences, n_batch tokens.
            group: list[int] = []
            n = 0
            while i < len(encoded) and len(group) < m.n_slots and n + len(encoded[i]) <= m.n_batch:
                for p, t in enumerate(encoded[i]):
                    batch.token[n] = t
                    batch.pos[n] = p
                    batch.n_seq_id[n] = 1
                    batch.seq_id[n][0] = len(group)
                    batch.logits[n] = 1
                    n += 1
                group.append(i)
                i += 1
            batch.n_tokens = n
            ll.llama_memory_clear(m.memory, True)
            rc = ll.llama_decode(m.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for seq, idx in enumerate(group):
                ptr = ll.llama_get_embeddings_seq(m.ctx, seq)
                if not ptr:
                    raise RuntimeError("the model produced no pooled embedding")
                vec = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))[:n_embd]
                if normalize:
                    norm = math.sqrt(sum(x * x for x in vec))
                    if norm > 0:
                        vec = [x / norm for x in vec]
                out[idx] = vec
    finally:
        ll.llama_memory_clear(m.memory, True)
        ll.llama_batch_free(batch)
    return out, sum(len(t) for t in encoded)


def embed_request(m: LoadedModel, tok: Tokenizer, req: wire.EmbedRequest
                  ) -> tuple[wire.Embeddings | wire.RequestFailed, int]:
    """One embedding request's answer and the prompt tokens it took (0 on failure)."""
    try:
        data, n_tokens = embed_batch(m, tok, req.inputs, req.normalize)
        return wire.Embeddings(req.id, data, n_tokens), n_tokens
    except RequestRejected as exc:
        return wire.RequestFailed(req.id, exc.code, exc.message), 0
    except Exception as exc:  # noqa: BLE001
        log.exception("embedding request %s failed", req.id)
        return wire.RequestFailed(req.id, "internal", f"{type(exc).__name__}: {exc}"), 0
