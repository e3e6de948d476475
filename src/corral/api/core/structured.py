"""Structured output and forced tool calls, on the router side: checking JSON schemas
against what the worker's schema->grammar converter honours, and building the schema
that forces a tool call.

The worker turns a JSON schema into a GBNF grammar (llama.cpp's converter, shipped with
llama-cpp-python as ``llama_cpp.llama_grammar.json_schema_to_gbnf``) and constrains
sampling with it. That converter silently ignores keywords it does not know, so every
schema is checked here first: a keyword it cannot honour is a 400 that names the keyword
and where it is (``response_format.json_schema.schema.properties.age.minimum``), never
an answer that quietly breaks the schema.
"""

from __future__ import annotations

import json
from typing import Any

from corral.errors import InvalidRequest

__all__ = ["check_schema", "forced_call_schema", "schema_text", "JSON_OBJECT_SCHEMA"]

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}

# Keywords that only annotate: no effect on what is valid.
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "strict", "$anchor",
})
# Keywords the converter turns into grammar rules.
_HONOURED = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "pattern", "format", "minLength", "maxLength",
})
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
MAX_SCHEMA_BYTES = 64 * 1024


def _fail(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where}: {message}", param=where)


def check_schema(schema: Any, where: str) -> None:
    """Raise a 400 naming the first keyword the converter cannot honour."""
    if not isinstance(schema, dict):
        raise _fail(where, "a JSON schema must be an object")
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise _fail(where, f"not JSON-serializable: {exc}") from None
    if size > MAX_SCHEMA_BYTES:
        raise _fail(where, f"the schema is {size} bytes; at most {MAX_SCHEMA_BYTES}")
    _check(schema, where, 0)


def _check(s: Any, where: str, depth: int) -> None:
    if depth > 32:
        raise _fail(where, "the schema nests deeper than 32 levels")
    if isinstance(s, bool):
        if s:
            return
        raise _fail(where, "the schema `false` (nothing is valid) is not supported")
    if not isinstance(s, dict):
        raise _fail(where, "a schema must be an object")
    for key, value in s.items():
        here = f"{where}.{key}"
        if key in _ANNOTATIONS:
            continue
        if key not in _HONOURED:
            raise _fail(here, f"the JSON schema keyword {key!r} is not supported by corral's "
                              "schema-to-grammar converter")
        if key == "type":
            types = value if isinstance(value, list) else [value]
            bad = [t for t in types if t not in _TYPES]
            if bad or not types:
                raise _fail(here, f"unknown type {bad[0] if bad else value!r}")
        elif key == "properties":
            if not isinstance(value, dict):
                raise _fail(here, "must be an object")
            for name, sub in value.items():
                _check(sub, f"{here}.{name}", depth + 1)
        elif key in ("$defs", "definitions"):
            if not isinstance(value, dict):
                raise _fail(here, "must be an object")
            for name, sub in value.items():
                _check(sub, f"{here}.{name}", depth + 1)
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
                raise _fail(here, "must be a list of property names")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                _check(value, here, depth + 1)
            elif not isinstance(value, bool):
                raise _fail(here, "must be a boolean or a schema")
        elif key == "items":
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    _check(sub, f"{here}.{i}", depth + 1)
            else:
                _check(value, here, depth + 1)
        elif key in ("prefixItems", "anyOf", "oneOf", "allOf"):
            if not isinstance(value, list) or not value:
                raise _fail(here, "must be a non-empty list of schemas")
            for i, sub in enumerate(value):
                _check(sub, f"{here}.{i}", depth + 1)
        elif key in ("minItems", "maxItems", "minLength", "maxLength"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _fail(here, "must be a non-negative integer")
        elif key == "enum":
            if not isinstance(value, list) or not value:
                raise _fail(here, "must be a non-empty list")
        elif key == "pattern":
            if not isinstance(value, str):
                raise _fail(here, "must be a string")
        elif key == "format":
            if value not in _FORMATS:
                raise _fail(here, f"the string format {value!r} is not supported "
                                  f"(supported: {', '.join(sorted(_FORMATS))})")
        elif key == "$ref":
            if not isinstance(value, str) or not value.startswith("#"):
                raise _fail(here, "only local references (#/...) are supported")
    _check_combinations(s, where)


def _check_combinations(s: dict[str, Any], where: str) -> None:
    """Keyword pairs the converter would honour only one of."""
    if "pattern" in s and ("minLength" in s or "maxLength" in s):
        key = "minLength" if "minLength" in s else "maxLength"
        raise _fail(f"{where}.{key}", f"{key} together with pattern is not supported "
                                      "(put the length into the pattern)")
    if "prefixItems" in s and "items" in s:
        raise _fail(f"{where}.items", "items together with prefixItems is not supported")
    if ("prefixItems" in s or isinstance(s.get("items"), list)) and ("minItems" in s or "maxItems" in s):
        raise _fail(f"{where}.minItems" if "minItems" in s else f"{where}.maxItems",
                    "item counts on a tuple (prefixItems) are not supported")
    if "allOf" in s:
        for i, part in enumerate(s["allOf"]):
            if not isinstance(part, dict) or not ("$ref" in part or "properties" in part or "anyOf" in part):
                raise _fail(f"{where}.allOf.{i}", "allOf is supported only over object schemas "
                                                  "with properties (or $refs to them)")
    if "minItems" in s and "maxItems" in s and s["minItems"] > s["maxItems"]:
        raise _fail(f"{where}.minItems", "minItems is larger than maxItems")
    if "minLength" in s and "maxLength" in s and s["minLength"] > s["maxLength"]:
        raise _fail(f"{where}.minLength", "minLength is larger than maxLength")


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, ensure_ascii=False)


def _call_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    params = parameters if parameters else {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forced_call_schema(functions: list[tuple[str, dict[str, Any] | None]]) -> dict[str, Any]:
    """The schema of one call ``{"name": ..., "arguments": {...}}`` to one of
    ``functions`` (name, parameters schema): what tool_choice required/named forces."""
    defs: dict[str, Any] = {}
    calls = []
    for name, params in functions:
        if params and ("$defs" in params or "definitions" in params):
            # references (#/$defs/x) resolve from the root: lift the definitions there
            params = dict(params)
            for key in ("$defs", "definitions"):
                defs.setdefault(key, {}).update(params.pop(key, None) or {})
        calls.append(_call_schema(name, params))
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return {**schema, **defs}
