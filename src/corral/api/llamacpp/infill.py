"""Code infill: llama-server's ``POST /infill``, the route editor plugins (llama.vscode,
llama.vim) call. The worker builds the prompt from the model's FIM tokens
(``worker/output/infill.py``); a model without them is a 400 naming it. The answer is
llama-server's completion object (``content``, ``stop``, ``tokens_predicted``,
``timings``...); ``stream: true`` sends one such object per piece as server-sent events,
then the final one (``stop: true``) with the timings.

OpenAI's ``suffix`` on /v1/completions and Ollama's on /api/generate run the same way
(``infill_request``): the prompt is the prefix, the suffix the text after the gap.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from corral import wire
from corral.api.core.dialect import Generation, Outcome, TextEvent, run_generation
from corral.api.core.generation import GenerationSpec
from corral.api.core.schemas import parse_body
from corral.api.http import json_response, plane_of, sse_data, sse_stream
from corral.api.llamacpp.schemas import SPELLING, InfillBody, model_that
from corral.api.openai.routes import timings_body
from corral.control.generation_defaults import sampling_defaults
from corral.errors import CorralError

__all__ = ["infill_request", "router"]

router = APIRouter()


def infill_request(rid: str, prefix: str, suffix: str, params: wire.SamplingParams) -> wire.GenerateRequest:
    """A fill-in-the-middle request for a dialect's ``suffix`` (its prompt is the prefix)."""
    return wire.GenerateRequest(id=rid, params=params, infill=wire.Infill(prefix=prefix, suffix=suffix))


def _stop_type(o: Outcome) -> str:
    if o.finish_reason == "length":
        return "limit"
    if o.finish_reason == "stop":
        return "word" if o.stop_string else "eos"
    return "none"


def _final(gen: Generation, content: str, params: wire.SamplingParams) -> dict[str, Any]:
    o = gen.outcome()
    fin = gen.stream.finished
    v = params.values()
    return {"index": 0, "content": content, "tokens": [], "id_slot": fin.slot if fin else -1, "stop": True,
            "model": gen.model, "tokens_predicted": o.completion_tokens, "tokens_evaluated": o.prompt_tokens,
            "tokens_cached": o.prompt_tokens + o.completion_tokens, "truncated": False,
            "has_new_line": "\n" in content, "stop_type": _stop_type(o), "stopping_word": o.stop_string or "",
            "generation_settings": {"n_predict": -1 if v.max_tokens is None else v.max_tokens,
                                    "temperature": v.temperature, "top_k": v.top_k, "top_p": v.top_p,
                                    "min_p": v.min_p, "seed": v.seed, "stop": v.stop, "model": gen.model},
            "timings": timings_body(fin.timings, fin.usage) if fin else None}


@router.post("/infill")
async def infill(request: Request) -> Response:
    body = await parse_body(request, InfillBody)
    body.check()
    params = body.sampling()
    model = await model_that(plane_of(request), body.model, "infill")
    rid = "infill-" + secrets.token_hex(12)
    lora = None if body.lora is None else [wire.LoraScale(e.id, e.scale) for e in body.lora]
    req = wire.GenerateRequest(id=rid, prompt=body.prompt, params=params, infill=body.infill(), lora=lora,
                               t_max_predict_ms=body.t_max_predict_ms)
    spec = GenerationSpec(model, "infill", rid, [req], prefix=body.input_prefix or body.input_suffix,
                          cache_salt=body.cache_salt, field_names={f"params.{f}": name for f, name in SPELLING.items()})
    gen = await run_generation(request, spec, stream=body.stream)
    if spec.target is not None:  # the settings it ran with: the model's defaults where it gave none
        params = params.over(sampling_defaults(spec.target.pool.spec))
    if not body.stream:
        return json_response(_final(gen, gen.text, params))

    async def events() -> AsyncIterator[bytes]:
        n = 0
        text = []
        try:
            async for ev in gen.events():
                if isinstance(ev, TextEvent) and ev.text:
                    n += 1
                    text.append(ev.text)
                    yield sse_data({"index": 0, "content": ev.text, "tokens": [], "stop": False, "id_slot": -1,
                                    "tokens_predicted": n, "tokens_evaluated": 0})
            yield sse_data({**_final(gen, "", params), "has_new_line": "\n" in "".join(text)})
        except CorralError as exc:
            yield sse_data(exc.to_body())
        finally:
            gen.close()
    return sse_stream(events())
