"""A generation request's way in, before the step: ``prepare`` (tokens, the thinking's plan, the
checks, the grammar's text; thread-safe: the worker's reader thread calls it, so long prompts and
schema conversion never stall ``Engine.step``) and ``job`` (on the engine thread: the queued
``Job`` with its adapter set and grammar sampler). RequestRejected where a request cannot run."""

from __future__ import annotations

import time

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.lora.adapters import LoraAdapters
from corral.worker.media.prompt import has_media
from corral.worker.model import LoadedModel
from corral.worker.prompt import requests
from corral.worker.prompt.prompts import PreparedRequest, PromptPreparer
from corral.worker.reasoning.feature import ReasoningFeature
from corral.worker.prefill import prompt_cuts
from corral.worker.slots import Job, check_params

__all__ = ["Intake"]


class Intake:
    def __init__(self, settings: wire.WorkerSettings, m: LoadedModel, prompts: PromptPreparer,
                 reasoning: ReasoningFeature, lora: LoraAdapters) -> None:
        self.model_id, self.m, self.prompts, self.reasoning, self.lora = settings.model_id, m, prompts, reasoning, lora
        self.cuts = prompt_cuts(m)  # where a completion's prompt chunks stop (not infill's, as llama-server)

    def prepare(self, req: wire.GenerateRequest) -> PreparedRequest:
        """Tokenize and check ``req``, and turn its schema into a grammar's text."""
        if self.m.embedding:
            raise RequestRejected("invalid_request", f"model {self.model_id} is loaded for embeddings only")
        tokens, plan = self.reasoning.prepare(req, self.prompts)
        check_params(req.params)
        requests.check_generation_fields(req, self.m.n_vocab, len(tokens))
        self.lora.check(req, has_media(tokens))  # an unknown adapter is a 400
        return PreparedRequest(req, tokens, requests.grammar_text(req), plan)

    def job(self, prepared: PreparedRequest) -> Job:
        """The queued job of a prepared request (its grammar compiled here, on the engine thread)."""
        req = prepared.req
        job = Job(req, prepared.tokens, time.perf_counter(), reasoning=prepared.reasoning, lora=self.lora.key_of(req))
        job.grammar = requests.grammar_sampler(self.m.vocab, prepared.gbnf)
        if req.infill is None:
            job.cuts = self.cuts
        return job
