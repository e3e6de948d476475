"""Reasoning formats: how a model's thinking is marked in its output, and which one a chat
template uses. A leaf module (nothing of corral): the worker splits with it
(``corral.worker.reasoning.plan``), the router reads a model's capabilities with it.

Formats:

- tag pairs, the thinking between an open and a close tag: ``deepseek`` (``<think>`` ...
  ``</think>``: DeepSeek R1, Qwen3, QwQ and most others), ``magistral`` (``[THINK]`` ...
  ``[/THINK]``), ``command-r`` (``<|START_THINKING|>`` ... ``<|END_THINKING|>``), ``seed``
  (``<seed:think>`` ... ``</seed:think>``);
- ``harmony`` (gpt-oss): channels; ``<|channel|>analysis<|message|>`` ... ``<|end|>`` is the
  thinking, ``<|channel|>final<|message|>`` ... the answer, ``<|channel|>commentary
  to=functions.NAME ... <|message|>{args}`` a tool call.

``detect(template)`` picks the format a template renders (its thinking markers appear in
it), else ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReasoningFormat", "FORMATS", "FORMAT_NAMES", "detect", "resolve", "HARMONY"]

HARMONY = "harmony"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    open: str  # the text that starts the thinking
    close: str  # the text that ends it (the worker forces it when the budget is spent)
    empty: str  # a generation that skips the thinking starts with this (thinking off)
    markers: tuple[str, ...]  # a template that contains one of these uses the format


_HARMONY_FINAL = "<|channel|>final<|message|>"

FORMATS: dict[str, ReasoningFormat] = {f.name: f for f in (
    ReasoningFormat("deepseek", "<think>", "</think>", "<think>\n\n</think>\n\n", ("<think>", "</think>")),
    ReasoningFormat("magistral", "[THINK]", "[/THINK]", "", ("[THINK]",)),
    ReasoningFormat("command-r", "<|START_THINKING|>", "<|END_THINKING|>", "", ("<|START_THINKING|>",)),
    ReasoningFormat("seed", "<seed:think>", "</seed:think>", "<seed:think>\n\n</seed:think>\n\n",
                    ("<seed:think>",)),
    ReasoningFormat(HARMONY, "<|channel|>analysis<|message|>", "<|end|><|start|>assistant" + _HARMONY_FINAL,
                    _HARMONY_FINAL, ("<|channel|>",)),
)}
FORMAT_NAMES = ("auto", "none", *FORMATS)


def detect(template: str | None) -> str:
    """The format a chat template's text uses ("none" without a template or markers).
    Harmony first: its templates mention no think tags, but some tag templates mention
    nothing of harmony."""
    if not template:
        return "none"
    if "<|channel|>" in template and "<|message|>" in template:
        return HARMONY
    for f in FORMATS.values():
        if f.name != HARMONY and any(m in template for m in f.markers):
            return f.name
    return "none"


def resolve(setting: str, template: str | None) -> ReasoningFormat | None:
    """The format a model runs with: the ``reasoning_format`` setting ("auto": detected
    from the template; "none": no splitting), or None."""
    name = detect(template) if setting == "auto" else setting
    return FORMATS.get(name)
