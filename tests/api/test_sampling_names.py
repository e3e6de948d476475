"""The sampling fields of every dialect come from one list, ``wire.SamplingParams``'s fields
(``wire.spelled``), with each dialect's spelling where it names a field otherwise: a body
that sets every knob it has reaches the wire with each of them, under the wire's name."""

from __future__ import annotations

from typing import Any

from corral import wire
from corral.api.anthropic.schemas import AnthropicMessagesRequest
from corral.api.core.schemas import CompletionRequest
from corral.api.llamacpp.schemas import InfillBody
from corral.api.ollama.schemas import OPTION_NAMES, OllamaOptions, sampling_from_options
from corral.api.openai.responses_schemas import ResponsesRequest
from corral.model.settings import SAMPLING_KEYS, ModelSettings

# a value for each knob, none of them its default
KNOBS: dict[str, Any] = {
    "temperature": 0.5, "top_p": 0.5, "top_k": 7, "min_p": 0.25, "typical_p": 0.5, "repeat_penalty": 1.5,
    "repeat_last_n": 9, "presence_penalty": 0.5, "frequency_penalty": 0.25, "dry_multiplier": 0.5,
    "dry_base": 2.0, "dry_allowed_length": 3, "dry_penalty_last_n": 5, "dry_sequence_breakers": ["x"], "seed": 11}


def test_openai_and_llamacpp_bodies_carry_every_knob() -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": "p", "max_tokens": 5, "stop": "s",
                                             "ignore_eos": True, "logit_bias": {"3": 1.0}, **KNOBS})
    assert body.sampling() == wire.SamplingParams(max_tokens=5, stop=["s"], ignore_eos=True,
                                                  logit_bias={3: 1.0}, **KNOBS)
    infill = InfillBody.model_validate({"input_prefix": "a", "n_predict": 5, "stop": ["s"], **KNOBS})
    assert infill.sampling() == wire.SamplingParams(max_tokens=5, stop=["s"], **KNOBS)


def test_llamacpp_minus_one_is_no_limit_and_a_random_seed() -> None:
    body = InfillBody.model_validate({"input_prefix": "a", "n_predict": -1, "max_tokens": 4, "seed": -1})
    assert body.sampling() == wire.SamplingParams()
    assert InfillBody.model_validate({"input_prefix": "a", "max_tokens": 4}).sampling().max_tokens == 4


def test_ollama_options_under_their_names() -> None:
    ollama = {k: v for k, v in KNOBS.items() if k in OllamaOptions.model_fields}
    opts = OllamaOptions.model_validate({**ollama, "num_predict": 5, "stop": "s", "repeat_last_n": -1})
    want = wire.SamplingParams(**{**ollama, "max_tokens": 5, "stop": ["s"], "repeat_last_n": 100})
    assert sampling_from_options(opts, slot_ctx=100) == want
    assert sampling_from_options(OllamaOptions(num_predict=-2), slot_ctx=100) == wire.SamplingParams()
    # a 400 of the wire's bounds names the option as Ollama spells it
    assert OPTION_NAMES["params.max_tokens"] == "options.num_predict"
    assert OPTION_NAMES["params.top_k"] == "options.top_k"
    assert "params.dry_base" not in OPTION_NAMES  # Ollama has no DRY options


def test_anthropic_and_responses_bodies() -> None:
    body = AnthropicMessagesRequest.model_validate({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
                                                    "stop_sequences": ["s"], "top_k": 7, "temperature": 0.5})
    assert body.sampling() == wire.SamplingParams(max_tokens=5, stop=["s"], top_k=7, temperature=0.5)
    resp = ResponsesRequest.model_validate({"model": "m", "input": "hi", "max_output_tokens": 5, "top_p": 0.5})
    assert resp.sampling() == wire.SamplingParams(max_tokens=5, top_p=0.5)


def test_sampling_from_reads_spelled_names_and_converted_win() -> None:
    got = wire.sampling_from({"n": 3, "max_tokens": 9, "top_k": None, "seed": 4}, {"max_tokens": "n"}, seed=5)
    assert got == wire.SamplingParams(max_tokens=3, seed=5)
    assert wire.spelled({"max_tokens": "n"}) == {f: "n" if f == "max_tokens" else f
                                                  for f in wire.SamplingParams.__struct_fields__}


def test_a_models_defaults_name_wire_fields() -> None:
    """The knobs a model has defaults for (``SAMPLING_KEYS``: /props, Ollama's show, the defaults
    added to a request) are fields of the wire's SamplingParams and of ModelSettings."""
    assert set(SAMPLING_KEYS) <= set(wire.SamplingParams.__struct_fields__)
    assert set(SAMPLING_KEYS) <= set(ModelSettings.__struct_fields__)
