"""Per-request preparation the engine does on submit, beyond the prompt: checking the
structured-output, logprob and token fields, building the grammar sampler, the tool
call parser, the echoed prompt text; and answering tokenize/detokenize requests.

Everything that can be wrong with a request is found here, at submit, and answered
``RequestFailed(invalid_request)`` before the request takes a slot.
"""

from __future__ import annotations

import llama_cpp as ll

from corral import wire
from corral.worker.failures import RequestRejected
from corral.worker.sampling.grammar import GrammarError, init_grammar_sampler, schema_to_gbnf
from corral.worker.prompt.prompts import PromptPreparer
from corral.worker.tokens import Tokenizer
from corral.worker.output.toolcalls import ToolCallParser

__all__ = ["check_tokens", "check_generation_fields", "grammar_text", "grammar_sampler", "tool_parser", "echo_text",
           "tokenize",
           "MAX_TOP_LOGPROBS"]

MAX_TOP_LOGPROBS = 20


def check_tokens(tokens: list[int], n_vocab: int, field: str) -> list[int]:
    for t in tokens:
        if not 0 <= t < n_vocab:
            raise RequestRejected("invalid_request",
                                  f"{field}: token id {t} is not in this model's vocabulary (0..{n_vocab - 1})")
    return list(tokens)


def check_generation_fields(req: wire.GenerateRequest, n_vocab: int, n_prompt: int = 0) -> None:
    """The fields only a worker can check; ``n_prompt``: the prompt's tokens (its token_budget)."""
    if req.token_budget is not None and n_prompt > req.token_budget:
        raise RequestRejected("over_token_budget", f"the prompt has {n_prompt} tokens, more than the "
                              f"{req.token_budget} left of this key's token limits (tpm/tpd)")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise RequestRejected("invalid_request", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    if req.grammar is not None and req.json_schema is not None:
        raise RequestRejected("invalid_request", "give at most one of grammar and json_schema")
    if req.echo and req.messages is not None:
        raise RequestRejected("invalid_request", "echo is for prompts, not chat messages")
    check_tokens(list(req.params.logit_bias), n_vocab, "logit_bias")
    for b in req.params.logit_bias.values():
        if b != b:
            raise RequestRejected("invalid_request", "logit_bias: values must be numbers")


def grammar_text(req: wire.GenerateRequest) -> str | None:
    """The request's grammar as GBNF (a JSON schema converted), or None."""
    try:
        if req.json_schema is not None:
            return schema_to_gbnf(req.json_schema)
    except GrammarError as exc:
        raise RequestRejected("invalid_request", str(exc)) from None
    return req.grammar


def grammar_sampler(vocab: ll.llama_vocab_p, gbnf: str | None) -> ll.llama_sampler_p | None:
    """A grammar sampler (the caller owns it), or None."""
    if gbnf is None:
        return None
    try:
        return init_grammar_sampler(vocab, gbnf)
    except GrammarError as exc:
        raise RequestRejected("invalid_request", str(exc)) from None


def tool_parser(req: wire.GenerateRequest) -> ToolCallParser | None:
    return ToolCallParser(parallel=req.parallel_tool_calls) if req.parse_tool_calls else None


def echo_text(tok: Tokenizer, req: wire.GenerateRequest, tokens: list[int]) -> str:
    """The prompt as echoed: the text as given, or the tokens' text."""
    return req.prompt if req.prompt is not None else tok.detokenize(tokens)


def tokenize(tok: Tokenizer, req: wire.TokenizeRequest, prompts: PromptPreparer | None = None) -> wire.Tokenized:
    """Tokens of text, text of tokens, or (messages) the chat as the template renders it."""
    if sum(x is not None for x in (req.text, req.tokens, req.messages)) != 1:
        raise RequestRejected("invalid_request", "exactly one of text and tokens must be given")
    if req.messages is not None:
        if prompts is None:
            raise RequestRejected("invalid_request", "this model renders no chat template")
        return wire.Tokenized(req.id, [], [], prompts.render(req.messages, req.tools, fmt=req.prompt_format))
    if req.text is not None:
        tokens = tok.tokenize(req.text, add_special=req.add_special, parse_special=req.parse_special)
    else:
        tokens = check_tokens(req.tokens or [], tok.n_vocab, "tokens")
    pieces = [tok.piece(t) or tok.special_text(t).encode("utf-8") for t in tokens]
    text = req.text if req.text is not None else b"".join(tok.piece(t) for t in tokens).decode("utf-8", "replace")
    return wire.Tokenized(req.id, tokens, pieces, text)
