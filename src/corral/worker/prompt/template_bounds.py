"""Bounds on rendering a chat template: time, size, recursion (docs/internals/dialects.md,
"Chat templates are bounded").

The Jinja sandbox keeps a template from running code; these keep it from stalling or
bloating the worker. ``BoundedSandbox`` is the sandbox whose templates count what they
build, and ``bounded`` runs one render (or compile) under a ``RenderBudget``:

- **time**: a trace function (``sys.settrace``, only in the rendering thread, only while it
  renders) checks the deadline at every Python line and call. Jinja compiles a template to
  Python, so every loop iteration and macro call of a template is a line event: the check
  stops ``{% for x in range(10**5) %}{% for y in range(10**5) %}`` and an endless recursive
  macro alike. Checks in the sandbox's hooks alone would not: an empty loop body calls none.
  What runs in C between two lines (one string operation) is bounded by size, below.
- **size**: every value an intercepted operation makes (``+ * % ** //``, ``~``, every call
  and every filter) is checked before it is made where it can be (``'x' * n``, ``s.ljust(n)``,
  ``join``, ``replace``, ``%`` widths, ``10 ** n``) and after; no one value may exceed
  ``max_value`` characters (or items, or digits), all of them together ``max_created``
  (counted as made, never given back: a bound on the peak too), the output ``max_output``.
  ``range`` keeps the sandbox's ``MAX_RANGE``.
- **recursion**: the trace counts the template's own frames (its macros, blocks, recursive
  loops) open at once; past ``max_depth`` it stops, long before Python's recursion limit
  (which still stops any deeper recursion inside Jinja's runtime, as RecursionError).

Only the template's own frames (Jinja's ``<template>`` code) are traced line by line; the
runtime's and the filters' frames are seen at their calls (the deadline is checked there
too), so the trace costs a render about 2-4x its untraced time (a 200-message chat: ms).

A bound crossed raises ``TemplateBoundExceeded``, a BaseException so that no ``except
Exception`` in Jinja's runtime can swallow it (the trace is gone once it raised).
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["TemplateBounds", "TemplateBoundExceeded", "BoundedSandbox", "bounded", "DEFAULT_BOUNDS"]

MAX_SOURCE_CHARS = 1 << 20
TEMPLATE_FILENAME = "<template>"  # what Jinja compiles ``from_string`` templates as  # a template's text (real ones are 1-60 KB)


@dataclass(frozen=True)
class TemplateBounds:
    time_s: float = 2.0
    max_value: int = 4 << 20       # characters, items or decimal digits of one value
    max_output: int = 8 << 20      # characters rendered
    max_created: int = 64 << 20    # all values made by one render together
    max_depth: int = 100           # template frames open at once (a recursive macro: 1 or 2 a level)
    max_source: int = MAX_SOURCE_CHARS


DEFAULT_BOUNDS = TemplateBounds()


class TemplateBoundExceeded(BaseException):
    """A render crossed one of its bounds; ``str(exc)`` says which."""


@dataclass
class RenderBudget:
    bounds: TemplateBounds
    deadline: float | None
    created: int = 0
    depth: int = 0
    frames: set[int] = field(default_factory=set)

    def take(self, size: int, what: str) -> None:
        if size > self.bounds.max_value:
            raise TemplateBoundExceeded(f"{what} would make a value of {size} characters or items, more than "
                                        f"the bound of {self.bounds.max_value}")
        self.created += size
        if self.created > self.bounds.max_created:
            raise TemplateBoundExceeded(f"it made more than {self.bounds.max_created} characters or items "
                                        "in all (the bound of one render)")


_local = threading.local()


def _budget() -> RenderBudget:
    b: RenderBudget | None = getattr(_local, "budget", None)
    if b is None:  # outside ``bounded`` (Jinja folding constants while compiling): the size bounds alone
        b = RenderBudget(DEFAULT_BOUNDS, None)
    return b


@contextmanager
def bounded(bounds: TemplateBounds, *, timed: bool = True) -> Iterator[RenderBudget]:
    """Run the body (a compile or a render, in this thread) under ``bounds``."""
    budget = RenderBudget(bounds, time.monotonic() + bounds.time_s if timed else None)
    outer = getattr(_local, "budget", None)
    _local.budget = budget
    old_trace = sys.gettrace()
    if timed:
        sys.settrace(_tracer(budget))
    try:
        yield budget
    finally:
        if timed:
            sys.settrace(old_trace)
        _local.budget = outer


def _tracer(budget: RenderBudget) -> Callable[[FrameType, str, Any], Any]:
    deadline = budget.deadline
    assert deadline is not None
    max_depth = budget.bounds.max_depth
    seconds = budget.bounds.time_s

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateBoundExceeded(f"it ran longer than its time bound of {seconds:g} s")
        if event == "call":
            if frame.f_code.co_filename != TEMPLATE_FILENAME:
                return None  # Jinja's runtime, a filter: its calls are still seen, not its lines
            budget.depth += 1
            if budget.depth > max_depth:
                budget.depth = 0
                raise TemplateBoundExceeded(f"it nests deeper than {max_depth} template calls (a recursion bound)")
        elif event == "return":
            budget.depth -= 1
        return trace

    return trace


# ---------------------------------------------------------------- sizes


def _size(value: object) -> int:
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return _digits(value)
    return 1


def _digits(n: int) -> int:
    return (abs(n).bit_length() * 30103) // 100000 + 1  # decimal digits, near enough


# calls that make a value as large as a number they are given, in C
_WIDTH_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs"})
_WIDTH_FILTERS = frozenset({"center", "indent", "wordwrap", "truncate", "tojson", "batch", "slice", "format"})


def _largest_int(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return max((abs(a) for a in (*args, *kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)),
               default=0)


def _format_size(fmt: str, args: object) -> int:
    """Characters ``fmt % args`` or ``fmt.format(*args)`` may take, at most: the format,
    every number written in it (a width or precision may be any of them), and the args
    (a ``*`` width takes its number from them)."""
    items = tuple(args.values()) if isinstance(args, dict) else args if isinstance(args, tuple) else (args,)
    size = len(fmt) + sum(int(d) if len(d) < 19 else sys.maxsize for d in re.findall(r"\d+", fmt))
    if "*" in fmt:
        size += _largest_int(items, {})
    return size + sum(_size(a) * 4 for a in items)


def _pre_binop(op: str, left: Any, right: Any) -> int:
    """The size of ``left op right``, known before it is made (0 where it is small)."""
    if op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(n, int) and isinstance(seq, (str, bytes, list, tuple)):
                return len(seq) * max(n, 0)
        if isinstance(left, int) and isinstance(right, int):
            return _digits(left) + _digits(right)
    elif op == "+":
        return _size(left) + _size(right)
    elif op == "**" and isinstance(left, int) and isinstance(right, int):
        return _digits(left) * max(right, 0) if abs(left) > 1 else 1
    elif op == "%" and isinstance(left, str):
        return _format_size(left, right)
    return 0


def _pre_call(fn: Any, args: tuple[Any, ...]) -> int:
    """The size a call's result will have, where C would make it at once."""
    fn = getattr(fn, "__wrapped__", fn)  # the sandbox wraps str.format in its safe formatter
    target = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if isinstance(target, str):
        if name == "join" and args:
            items = args[0]
            if isinstance(items, (list, tuple)):
                return sum(_size(x) for x in items) + len(target) * len(items)
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            count = target.count(args[0]) if args[0] else len(target) + 1
            return len(target) + count * len(args[1])
        elif name in ("format", "format_map"):
            return _format_size(target, args)
        elif name in _WIDTH_METHODS:
            return len(target) + _largest_int(args, {})
    return 0


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    first = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0  # the context, before the value

    @functools.wraps(fn)  # keeps jinja_pass_arg (pass_context and the like)
    def call(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        what = f"the filter {name}"
        value, rest = (args[first], args[first + 1:]) if len(args) > first else (None, ())
        if name in _WIDTH_FILTERS:
            budget.take(_size(value) + _largest_int(rest, kwargs), what)
        if name == "format" and isinstance(value, str):
            budget.take(_format_size(value, kwargs or rest), what)
        elif name == "join" and isinstance(value, (list, tuple)):
            sep = rest[0] if rest else kwargs.get("d", "")
            budget.take(sum(_size(x) for x in value) + _size(sep) * len(value), what)
        elif name == "replace" and isinstance(value, str):
            budget.take(_pre_call(value.replace, rest), what)
        result = fn(*args, **kwargs)
        budget.take(_size(result), what)
        return result

    return call


class _BoundedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # ``a ~ b`` builds its string through the environment, so it is counted
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, counting every value its templates make (``RenderBudget``)."""

    intercepted_binops = frozenset({"+", "*", "%", "**", "//"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.globals.pop("lipsum", None)  # text made in Python loops, of any size asked
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}

    def add_filter(self, name: str, fn: Callable[..., Any]) -> None:
        self.filters[name] = _bounded_filter(name, fn)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        what = f"the operation {operator!r}"
        budget.take(_pre_binop(operator, left, right), what)
        result = super().call_binop(context, operator, left, right)
        budget.take(_size(result), what)
        return result

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _budget()
        what = f"the call of {getattr(__obj, '__name__', 'a function')}"
        budget.take(_pre_call(__obj, args), what)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.take(_size(result), what)
        return result

    def bounded_concat(self, parts: tuple[Any, ...]) -> str:
        budget = _budget()
        pieces = [str(p) for p in parts]
        budget.take(sum(len(p) for p in pieces), "the operation '~'")
        return "".join(pieces)


def render_bounded(pieces: Iterator[str], bounds: TemplateBounds) -> str:
    """Join a template's output (``Template.generate``), stopping past ``max_output``."""
    out: list[str] = []
    n = 0
    for piece in pieces:
        n += len(piece)
        if n > bounds.max_output:
            raise TemplateBoundExceeded(f"its output passed the bound of {bounds.max_output} characters")
        out.append(piece)
    return "".join(out)
