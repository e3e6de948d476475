"""A model's generation defaults, added to each request that leaves them out.

A model's table (or ``[defaults]``, a preset's section, a Modelfile's ``PARAMETER``) may
set the sampling knobs (``corral.model.settings.SAMPLING_KEYS``), ``seed``,
``default_max_tokens``, ``stop``, ``system``, ``messages`` (an opening conversation) and
``chat_template_kwargs``. The router adds
them to a ``wire.GenerateRequest`` here, in ``ControlPlane.generate``, the one door every
generation passes: a knob the request set is the request's; one it left out (None on the
wire) is the model's; the worker fills what is still unset from ``SAMPLING_BUILTIN``
(``wire.SamplingParams.values``). The router owns this step, not the worker, so a change of
a default needs no restart and two ids served by one worker keep their own.

``in_force`` is what the listings show (``GET /models``, ``/props``, Ollama's ``/api/show``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from corral import wire
from corral.model.settings import SAMPLING_BUILTIN, SAMPLING_KEYS, ModelSettings

__all__ = ["apply", "in_force", "sampling_defaults", "with_prompt_format", "with_system"]

Rendered = TypeVar("Rendered", wire.GenerateRequest, wire.TokenizeRequest)  # what a worker renders a chat for


def sampling_defaults(s: ModelSettings) -> dict[str, Any]:
    """The knobs ``s`` sets (its ``seed`` and ``default_max_tokens`` included)."""
    out = {k: getattr(s, k) for k in SAMPLING_KEYS if getattr(s, k) is not None}
    if s.seed is not None:
        out["seed"] = s.seed
    if s.default_max_tokens is not None:
        out["max_tokens"] = s.default_max_tokens
    return out


def apply(s: ModelSettings, msg: wire.GenerateRequest) -> wire.GenerateRequest:
    """``msg`` with ``s``'s defaults where it set nothing: sampling knobs, the token limit,
    the system message of a chat without one, and the template variables it did not give."""
    change: dict[str, Any] = {}
    params = msg.params.over(sampling_defaults(s))
    if params is not msg.params:
        change["params"] = params
    if msg.messages is not None and (s.messages or s.system is not None):
        turns = list(msg.messages)
        lead = 1 if turns and turns[0].role == "system" else 0
        opening = [wire.ChatMessage(t.role, t.content) for t in s.messages or []]
        if s.system is not None and not any(m.role == "system" for m in turns):
            turns.insert(0, wire.ChatMessage("system", s.system))
            lead = 1
        change["messages"] = [*turns[:lead], *opening, *turns[lead:]]
    if s.chat_template_kwargs:
        change["template_kwargs"] = {**s.chat_template_kwargs, **(msg.template_kwargs or {})}
    return msgspec.structs.replace(msg, **change) if change else msg


def with_prompt_format(s: ModelSettings, msg: Rendered) -> Rendered:
    """``msg`` carrying ``s``'s plain prompt (pre/user/ai/system_prompt): a variant's, for
    a worker loaded for another id (the worker renders a model without a chat template so)."""
    fmt = wire.PromptFormat(pre_prompt=s.pre_prompt, user_prompt=s.user_prompt, ai_prompt=s.ai_prompt,
                            system_prompt=s.system_prompt)
    return msgspec.structs.replace(msg, prompt_format=fmt)


def with_system(s: ModelSettings, msg: wire.TokenizeRequest) -> wire.TokenizeRequest:
    """A rendering of chat messages (/apply-template, token counts) with the system message
    a generation would get."""
    if s.system is None or msg.messages is None or any(m.role == "system" for m in msg.messages):
        return msg
    return msgspec.structs.replace(msg, messages=[wire.ChatMessage("system", s.system), *msg.messages])


def in_force(s: ModelSettings) -> dict[str, Any]:
    """Every knob as a request that sets none gets it: the model's, else the built-in;
    with ``seed`` (None: random), ``max_tokens`` (None: until the context is full),
    ``system`` and ``chat_template_kwargs``."""
    own = sampling_defaults(s)
    out = {k: own.get(k, SAMPLING_BUILTIN[k]) for k in SAMPLING_KEYS}
    out["seed"] = s.seed
    out["max_tokens"] = s.default_max_tokens
    out["system"] = s.system
    out["chat_template_kwargs"] = dict(s.chat_template_kwargs or {})
    return out
