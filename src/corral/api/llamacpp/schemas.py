"""Bodies of llama-server's routes (/infill, /rerank, /apply-template) and the model they name.

Unknown fields are ignored (editors send llama-server options corral has no use for:
``samplers``, ``cache_prompt``, ``t_max_prompt_ms``...; ``lora`` is used). Sampling fields have
llama-server's names (``n_predict``, ``top_k``...) and wire.SamplingParams's bounds.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral import wire
from corral.api.core.lora import LoraList
from corral.api.core.schemas import CacheSalt
from corral.api.http import model_or_only
from corral.control.capabilities import can
from corral.control.plane import ControlPlane
from corral.errors import InvalidRequest

__all__ = ["BODIES", "SPELLING", "ApplyTemplateBody", "InfillBody", "InfillChunkBody", "RerankBody", "model_for", "model_that"]

_LENIENT = ConfigDict(extra="ignore")


model_for = model_or_only  # the named model, or the only one the key sees


async def model_that(plane: ControlPlane, name: str | None, task: Literal["infill", "rerank"]) -> str:
    """The named model; with none named, the only one configured, or else the only one that
    can do ``task`` (editor plugins send no model): a 400 when that is not one model."""
    pools = plane.visible_pools()
    if name or len(pools) == 1:
        return model_for(plane, name)
    able = await asyncio.to_thread(lambda: [p.spec.id for p in pools if can(p, task)])
    if len(able) == 1:
        return able[0]
    which = f"several can ({', '.join(sorted(able))})" if able else "none of them can"
    raise InvalidRequest(f"model: required field is missing: more than one model is configured and {which} "
                         f"{'fill in the middle' if task == 'infill' else 'rerank'}", param="model")


# llama-server's names of the wire.SamplingParams fields it names otherwise (its bodies, /props)
SPELLING = {"max_tokens": "n_predict"}


class InfillChunkBody(BaseModel):
    model_config = _LENIENT
    text: str
    filename: str = "tmp"


class InfillBody(BaseModel):
    """llama-server's /infill: ``input_prefix`` and ``input_suffix`` (at least one of them),
    ``input_extra`` chunks, ``prompt`` (text after the middle token), the stop rules and
    llama-server's sampling fields."""
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[InfillChunkBody] = []
    prompt: str = ""
    n_indent: int = Field(0, ge=0, le=1 << 20)
    t_max_predict_ms: int = Field(0, ge=0, le=1 << 40)
    stream: bool = False
    n_predict: int | None = None  # -1: until the end or the context is full
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    typical_p: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    lora: LoraList | None = None  # [{id, scale}] (api/core/lora.py)
    cache_salt: CacheSalt | None = None  # shares the prompt cache only with the same salt

    def check(self) -> None:
        if self.input_prefix is None and self.input_suffix is None:
            raise InvalidRequest("input_prefix or input_suffix is required", param="input_prefix")
        if self.stop is not None and (len(self.stop) > 16 or any(not s for s in self.stop)):
            raise InvalidRequest("stop: at most 16 non-empty strings", param="stop")

    def infill(self) -> wire.Infill:
        return wire.Infill(prefix=self.input_prefix or "", suffix=self.input_suffix or "",
                           extra=[wire.InfillChunk(c.filename, c.text) for c in self.input_extra],
                           n_indent=self.n_indent)

    def sampling(self) -> wire.SamplingParams:
        """The wire's fields under llama-server's names (``SPELLING``; ``max_tokens`` too); -1
        is no limit (``n_predict``) and a random seed. Bounds: checked once for the whole
        request (api/core/generation.py's check_bounds)."""
        n = self.n_predict if self.n_predict is not None else self.max_tokens
        seed = self.seed if self.seed is not None and self.seed >= 0 else None
        return wire.sampling_from(vars(self), SPELLING, max_tokens=None if n is None or n < 0 else n, seed=seed)


class RerankBody(BaseModel):
    """Jina's and Cohere's rerank (``documents``), or TEI's (``texts``, answered as a bare list)."""
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    query: str
    documents: list[str] | None = None
    texts: list[str] | None = None
    top_n: int | None = None
    return_documents: bool = False
    return_text: bool = False  # TEI's name for it

    @property
    def tei(self) -> bool:
        return self.documents is None and self.texts is not None

    def docs(self) -> list[str]:
        docs = self.documents if self.documents is not None else self.texts
        field = "texts" if self.tei else "documents"
        if not docs:
            raise InvalidRequest(f"{field}: must be a non-empty list of strings", param=field)
        if len(docs) > 2048:
            raise InvalidRequest(f"{field}: at most 2048 items", param=field)
        for i, d in enumerate(docs):
            if not d:
                raise InvalidRequest(f"{field}.{i}: must not be empty", param=field)
        if not self.query:
            raise InvalidRequest("query: must not be empty", param="query")
        if self.top_n is not None and not 1 <= self.top_n <= len(docs):
            raise InvalidRequest(f"top_n: must be between 1 and the number of documents ({len(docs)}), "
                                 f"got {self.top_n}", param="top_n")
        return docs


class ApplyTemplateBody(BaseModel):
    model_config = _LENIENT
    model: str | None = Field(None, min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None


# the request bodies the OpenAPI document describes (api/openapi_doc.py)
BODIES: dict[tuple[str, str], type[BaseModel]] = {("post", "/infill"): InfillBody, ("post", "/v1/rerank"): RerankBody,
                                                  ("post", "/apply-template"): ApplyTemplateBody}
