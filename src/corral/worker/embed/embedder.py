"""Pooled embeddings and reranking: each input in its own sequence, as many per decode as fit,
across every request waiting (one request's documents share decodes with the others').

An embedding model (``embedding = true``, or a GGUF with rank pooling) embeds on its own
context. A generative model embeds on a second context over the same weights
(``worker/embed/context.py``: created on the first embedding request, its KV counted in the
model's memory from then on), mean-pooled unless ``pooling`` says otherwise.

Inputs are tokenized as llama-server does: an embedding input with the model's special
tokens; a rerank pair from the model's ``rerank`` template when it has one, else
``[BOS] query [EOS] [SEP] document [EOS]`` (each where the vocabulary adds it). A rerank
score is the rank pooling's first output, unnormalized; embeddings are L2-normalized on
request. The KV cache is cleared before each decode: inputs share nothing.
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
from corral.worker.embed.context import EmbedContext, open_embed_context

__all__ = ["EmbedContext", "Embedder", "rerank_tokens"]

log = logging.getLogger("corral.worker.embed.embedder")


def rerank_tokens(m: LoadedModel, tok: Tokenizer, query: str, doc: str) -> list[int]:
    """A (query, document) pair as llama-server builds it (format_prompt_rerank)."""
    template = m.meta("tokenizer.chat_template.rerank")
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", doc)
        return tok.tokenize(text, add_special=False, parse_special=True)
    vocab = m.vocab
    eos = ll.llama_vocab_eos(vocab)
    if eos < 0:
        eos = ll.llama_vocab_sep(vocab)
    out: list[int] = []
    if ll.llama_vocab_get_add_bos(vocab):
        out.append(ll.llama_vocab_bos(vocab))
    out += tok.tokenize(query, add_special=False, parse_special=False)
    add_eos = ll.llama_vocab_get_add_eos(vocab)
    if add_eos:
        out.append(eos)
    if ll.llama_vocab_get_add_sep(vocab):
        out.append(ll.llama_vocab_sep(vocab))
    out += tok.tokenize(doc, add_special=False, parse_special=False)
    if add_eos:
        out.append(eos)
    return out


class Embedder:
    """Answers EmbedRequests for an engine: ``submit`` queues one (checked), ``run_waiting``
    answers the queue between steps."""

    def __init__(self, m: LoadedModel, tok: Tokenizer, settings: wire.WorkerSettings) -> None:
        self.m = m
        self.tok = tok
        self.settings = settings
        self.ec: EmbedContext | None = None
        self.waiting: list[wire.EmbedRequest] = []  # checked, answered at the next step
        if m.embedding:
            n_out = ll.llama_model_n_cls_out(m.model) if m.pooling == ll.LLAMA_POOLING_TYPE_RANK \
                else ll.llama_model_n_embd(m.model)
            self.ec = EmbedContext(m.ctx, m.memory, m.n_batch, m.n_slots, min(m.n_ctx_slot, m.n_batch), m.pooling,
                                   n_out)

    @property
    def kv_bytes(self) -> int:
        return self.ec.kv_bytes if self.ec is not None else 0

    @property
    def reranks(self) -> bool:
        return self.m.embedding and self.m.pooling == ll.LLAMA_POOLING_TYPE_RANK

    def check(self, req: wire.EmbedRequest) -> wire.EmbedRequest:
        """Refuse what this model cannot answer (RequestRejected), before it queues."""
        mid = self.settings.model_id
        if req.query is not None and not self.reranks:
            raise RequestRejected("invalid_request", f"model {mid} does not rerank: it needs rank pooling "
                                                     "(a reranker GGUF, or pooling = \"rank\")")
        if not req.inputs:
            raise RequestRejected("invalid_request", "input must not be empty")
        return req

    def submit(self, req: wire.EmbedRequest) -> None:
        """Queue ``req`` for the next step (RequestRejected if this model cannot answer it)."""
        self.waiting.append(self.check(req))

    def run_waiting(self) -> tuple[list[wire.Embeddings | wire.RequestFailed], int]:
        """Answer every queued request, all their inputs in shared decodes (``run``)."""
        reqs, self.waiting = self.waiting, []
        return self.run(reqs)

    def fail_waiting(self, message: str) -> list[wire.RequestFailed]:
        """End every queued request with RequestFailed(internal) (the engine failed)."""
        reqs, self.waiting = self.waiting, []
        return [wire.RequestFailed(r.id, "internal", message) for r in reqs]

    def _context(self) -> EmbedContext:
        if self.ec is None:
            self.ec = open_embed_context(self.m, self.settings)
        return self.ec

    def _encode(self, ec: EmbedContext, req: wire.EmbedRequest) -> list[list[int]]:
        limit = ec.limit
        if req.query is not None:
            q = self.tok.tokenize(req.query, add_special=False, parse_special=False)
            if len(q) + 2 >= limit:
                raise RequestRejected("context_length_exceeded",
                                      f"the query has {len(q)} tokens, but this model ranks at most {limit} "
                                      "tokens of query and document together")
        encoded: list[list[int]] = []
        for i, text in enumerate(req.inputs):
            if req.query is not None:
                if not text:
                    raise RequestRejected("invalid_request", f"documents[{i}] is empty")
                toks = rerank_tokens(self.m, self.tok, req.query, text)
            else:
                toks = self.tok.tokenize(text, add_special=True)
            if not toks:
                raise RequestRejected("invalid_request", f"input[{i}] is empty")
            if len(toks) > limit:
                if not req.truncate:
                    what = "query and documents" if req.query is not None else "input"
                    raise RequestRejected("context_length_exceeded", f"{what}[{i}] has {len(toks)} tokens, "
                                                                     f"but this model embeds at most {limit}")
                toks = toks[:limit]
            encoded.append(toks)
        return encoded

    def run(self, reqs: list[wire.EmbedRequest]) -> tuple[list[wire.Embeddings | wire.RequestFailed], int]:
        """Answer ``reqs`` (every input of all of them in shared decodes); and the prompt tokens taken."""
        answers: list[wire.Embeddings | wire.RequestFailed | None] = [None] * len(reqs)
        jobs: list[tuple[int, list[list[int]]]] = []
        try:
            ec = self._context()
        except Exception as exc:  # the requests fail, not the worker
            log.exception("could not create the embedding context")
            return [wire.RequestFailed(r.id, "internal", f"no embedding context: {exc}") for r in reqs], 0
        for k, req in enumerate(reqs):
            try:
                jobs.append((k, self._encode(ec, req)))
            except RequestRejected as exc:
                answers[k] = wire.RequestFailed(req.id, exc.code, exc.message)
        flat = [(k, i, toks) for k, enc in jobs for i, toks in enumerate(enc)]
        try:
            pooled = _pooled(ec, [toks for _, _, toks in flat])
        except Exception as exc:  # the requests fail, not the worker
            log.exception("embedding decode failed")
            for k, _ in jobs:
                answers[k] = wire.RequestFailed(reqs[k].id, "internal", f"{type(exc).__name__}: {exc}")
            return [a for a in answers if a is not None], 0
        vectors = {(k, i): vec for (k, i, _), vec in zip(flat, pooled)}
        n_total = 0
        for k, enc in jobs:
            req = reqs[k]
            rank = req.query is not None
            data = [vectors[(k, i)][:1] if rank else _normalized(vectors[(k, i)], req.normalize)
                    for i in range(len(enc))]
            n = sum(len(t) for t in enc)
            n_total += n
            answers[k] = wire.Embeddings(req.id, data, n)
        return [a for a in answers if a is not None], n_total


def _normalized(vec: list[float], normalize: bool) -> list[float]:
    if not normalize:
        return vec
    norm = math.sqrt(sum(x * x for x in vec))
    return [x / norm for x in vec] if norm > 0 else vec


def _pooled(ec: EmbedContext, inputs: list[list[int]]) -> list[list[float]]:
    """One pooled output per input (each whole in one sequence), in order."""
    out: list[list[float]] = []
    if not inputs:
        return out
    batch = ll.llama_batch_init(ec.n_batch, 0, 1)
    try:
        i = 0
        while i < len(inputs):
            n = 0
            group = 0
            while i + group < len(inputs) and group < ec.n_seq and n + len(inputs[i + group]) <= ec.n_batch:
                for p, t in enumerate(inputs[i + group]):
                    batch.token[n] = t
                    batch.pos[n] = p
                    batch.n_seq_id[n] = 1
                    batch.seq_id[n][0] = group
                    batch.logits[n] = 1
                    n += 1
                group += 1
            batch.n_tokens = n
            ll.llama_memory_clear(ec.memory, True)
            rc = ll.llama_decode(ec.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for seq in range(group):
                ptr = ll.llama_get_embeddings_seq(ec.ctx, seq)
                if not ptr:
                    raise RuntimeError("the model produced no pooled embedding")
                out.append(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))[:ec.n_out])
            i += group
    finally:
        ll.llama_memory_clear(ec.memory, True)
        ll.llama_batch_free(batch)
    return out
