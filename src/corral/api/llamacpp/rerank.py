"""Reranking: ``POST /v1/rerank`` and ``/rerank`` (also ``/reranking``, ``/v1/reranking``,
as llama-server), in Jina's and Cohere's shape (``query``, ``documents``, ``top_n``,
``return_documents``) or TEI's (``texts``, ``return_text``, answered as a bare list).

    -> {"object": "list", "model", "results": [{"index", "relevance_score", "document"?}],
        "usage": {"prompt_tokens", "total_tokens"}}

Results are sorted by score, highest first. The model needs rank pooling (a reranker
GGUF says so; else its ``pooling = "rank"`` setting); the worker scores every
(query, document) pair as llama-server does, in shared decodes with the other requests
waiting (``worker/embed/embedder.py``).
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import wire
from corral.api.core.submit import observe, submit
from corral.api.core.target import resolve
from corral.api.core.schemas import parse_body
from corral.api.http import json_response, plane_of
from corral.api.llamacpp.schemas import RerankBody, model_that

__all__ = ["router"]

router = APIRouter()


@router.post("/v1/rerank")
@router.post("/rerank", include_in_schema=False)
@router.post("/v1/reranking", include_in_schema=False)
@router.post("/reranking", include_in_schema=False)
async def rerank(request: Request) -> Response:
    body = await parse_body(request, RerankBody)
    docs = body.docs()
    plane = plane_of(request)
    target = resolve(request, await model_that(plane, body.model, "rerank"), "rerank", adapters=False)
    msg = wire.EmbedRequest(id="rerank-" + secrets.token_hex(12), inputs=docs, query=body.query, normalize=False)
    [stream] = await submit(request, target, "rerank", [plane.embed(target.pool, msg)], wait_all=True)
    observe(plane, stream, "rerank", 200)
    emb = stream.embeddings
    assert emb is not None
    order = sorted(range(len(docs)), key=lambda i: -emb.data[i][0])[:body.top_n or len(docs)]
    if body.tei:
        return json_response([{"index": i, "score": emb.data[i][0], **({"text": docs[i]} if body.return_text else {})}
                              for i in order])
    results: list[dict[str, Any]] = []
    for i in order:
        r: dict[str, Any] = {"index": i, "relevance_score": emb.data[i][0]}
        if body.return_documents:
            r["document"] = {"text": docs[i]}
        results.append(r)
    return json_response({"object": "list", "model": stream.model, "results": results,
                          "usage": {"prompt_tokens": emb.prompt_tokens, "total_tokens": emb.prompt_tokens}})
