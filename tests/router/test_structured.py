"""Unit tests (no worker): which JSON schema keywords corral honours, and the schema that
forces a tool call."""

from __future__ import annotations

import pytest

from corral.api.structured import check_schema, forced_call_schema
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
