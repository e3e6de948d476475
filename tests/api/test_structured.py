"""Unit tests (no worker): which JSON schema keywords corral honours, and the schema that
forces a tool call."""

from __future__ import annotations

import pytest

from corral.api.core.structured import check_schema, forced_call_schema
from corral.errors import InvalidRequest


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": ["string", "null"]}},
     "required": ["a"], "additionalProperties": False, "title": "T", "description": "d"},
    {"type": "array", "items": {"enum": [1, "x", None]}, "minItems": 1, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}]},
    {"anyOf": [{"type": "boolean"}, {"const": 3}]},
    {"type": "string", "pattern": "^[a-z]+$"},
    {"type": "string", "minLength": 1, "maxLength": 4},
    {"type": "string", "format": "date-time"},
    {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "number"}}}},
     "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}},
    {"allOf": [{"$ref": "#/definitions/A"}], "definitions": {"A": {"type": "object", "properties": {}}}},
])
def test_supported(schema: dict) -> None:
    check_schema(schema, "json_schema")


@pytest.mark.parametrize("schema, param", [
    ({"type": "integer", "minimum": 0}, "s.minimum"),
    ({"type": "object", "properties": {"n": {"type": "number", "exclusiveMaximum": 3}}},
     "s.properties.n.exclusiveMaximum"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "s.uniqueItems"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "s.patternProperties"),
    ({"not": {"type": "string"}}, "s.not"),
    ({"type": "string", "format": "email"}, "s.format"),
    ({"type": "string", "pattern": "^a$", "maxLength": 3}, "s.maxLength"),
    ({"type": "decimal"}, "s.type"),
    ({"$ref": "https://example.com/x.json"}, "s.$ref"),
    ({"anyOf": [{"type": "string", "contains": {}}]}, "s.anyOf.0.contains"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "s.minItems"),
])
def test_unsupported_keyword_is_a_400_naming_it(schema: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        check_schema(schema, "s")
    assert ei.value.param == param and ei.value.status == 400


def test_forced_call_schema() -> None:
    params = {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "string"}}}
    one = forced_call_schema([("f", params)])
    assert one["properties"]["name"] == {"const": "f"}
    assert one["properties"]["arguments"]["properties"] == params["properties"]
    assert one["$defs"] == {"P": {"type": "string"}}  # lifted to the root, where #/$defs/... resolves
    two = forced_call_schema([("f", None), ("g", {"type": "object"})])
    assert [s["properties"]["name"]["const"] for s in two["anyOf"]] == ["f", "g"]
    check_schema(two, "x")


def test_n_choices_get_derived_seeds_and_their_own_requests() -> None:
    from corral.api.core.chat_request import ChatCompletionRequest
    from corral.api.core.generation import chat_spec, completion_spec
    from corral.api.core.schemas import CompletionRequest

    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                 "n": 3, "seed": 11})
    spec = chat_spec(body)
    assert [r.params.seed for r in spec.requests] == [11, 12, 13]
    assert len({r.id for r in spec.requests}) == 3
    unseeded = chat_spec(ChatCompletionRequest.model_validate({"model": "m", "n": 2, "messages": [
        {"role": "user", "content": "x"}]}))
    assert [r.params.seed for r in unseeded.requests] == [None, None]  # each worker draws its own
    comp = completion_spec(CompletionRequest.model_validate({"model": "m", "prompt": [[7], [5, 6]], "n": 2,
                                                             "seed": 1}))
    assert [(r.prompt, r.prompt_tokens, r.params.seed) for r in comp.requests] == [
        (None, [7], 1), (None, [7], 2), (None, [5, 6], 3), (None, [5, 6], 4)]
