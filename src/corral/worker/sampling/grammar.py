"""Grammars for constrained sampling: JSON schema -> GBNF, and llama.cpp's grammar sampler.

The JSON schema converter is llama.cpp's own, as llama-cpp-python ships it
(``llama_cpp.llama_grammar.json_schema_to_gbnf``); the router has already refused the
keywords it cannot honour (``corral.api.core.structured``). Two adjustments here:

- ``pattern``: the converter needs ``^...$``; JSON schema patterns are unanchored
  searches, so an unanchored pattern is anchored (a full match also matches the
  search, so every output still validates).
- strings: the converter's ``char`` rule admits raw control characters, which JSON does
  not (and a raw newline could end a chat answer at a stop string); they are excluded.

``GrammarError`` carries a message for ``RequestFailed(invalid_request)``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import llama_cpp as ll
from llama_cpp.llama_grammar import json_schema_to_gbnf

__all__ = ["GrammarError", "schema_to_gbnf", "init_grammar_sampler"]

_CHAR_RULE = 'char ::= [^"\\\\] |'
_JSON_CHAR_RULE = 'char ::= [^"\\\\\\x00-\\x1F\\x7F] |'


class GrammarError(ValueError):
    pass


def _anchor_patterns(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "pattern" and isinstance(v, str):
                v = (v if v.startswith("^") else "^" + v)
                v = v if v.endswith("$") and not v.endswith("\\$") else v + "$"
                out[k] = v
            elif k in ("enum", "const", "default", "examples"):
                out[k] = v
            else:
                out[k] = _anchor_patterns(v)
        return out
    if isinstance(node, list):
        return [_anchor_patterns(x) for x in node]
    return node


def schema_to_gbnf(schema_json: str) -> str:
    """GBNF text for a JSON schema given as JSON text."""
    try:
        schema = json.loads(schema_json)
    except ValueError as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}") from None
    try:
        gbnf: str = json_schema_to_gbnf(json.dumps(_anchor_patterns(copy.deepcopy(schema))))
    except RecursionError:
        raise GrammarError("json_schema: the schema nests too deeply to convert") from None
    except Exception as exc:  # noqa: BLE001 - the converter raises assert/Key/Value errors
        raise GrammarError(f"json_schema: cannot convert to a grammar: {type(exc).__name__}: {exc}") from None
    return str(gbnf).replace(_CHAR_RULE, _JSON_CHAR_RULE)


def init_grammar_sampler(vocab: ll.llama_vocab_p, gbnf: str) -> ll.llama_sampler_p:
    """A grammar sampler over ``gbnf`` (root rule ``root``); GrammarError if it does not parse."""
    if "\x00" in gbnf:
        raise GrammarError("grammar: must not contain NUL characters")
    smpl: ll.llama_sampler_p = ll.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    if not smpl:
        raise GrammarError("grammar: llama.cpp could not parse it (GBNF with a `root` rule is "
                           "expected; see the worker log for the parser's message)")
    return smpl
