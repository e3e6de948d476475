"""Model ids: what a valid id is, and the file name an id gets on disk.

Ids are written the way the ecosystem writes model names: plain names (``gemma-3-270m``),
Ollama's ``name:tag`` and ``namespace/name:tag`` (``llama3.2:1b``), and Hugging Face
names as llama.cpp's router uses them (``ggml-org/gemma-3-1b-it-GGUF:Q4_K_M``,
``hf.co/owner/repo:Q4_K_M``). Allowed: letters, digits, ``.``, ``_``, ``-``, ``/``
between non-empty parts that are not ``.`` or ``..``, and at most one ``:`` (the tag,
after the last ``/``). At most 200 characters, starting with a letter or digit.

An id never becomes a path. ``file_stem(id)`` is the id with every character other
than ``[A-Za-z0-9._-]`` written as ``%XX``: no ``/``, so no directories and no
traversal; one-to-one, so ``a/b`` (``a%2Fb``) and ``a--b`` never share a file; an id
made only of the plain characters keeps its name. Imports nothing of corral.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["MAX_ID_LENGTH", "id_problem", "file_stem", "id_from_file_stem"]

MAX_ID_LENGTH = 200
_CHARS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_ESCAPE_RE = re.compile(r"%([0-9A-F]{2})")
_MAX_STEM = 180  # file names stay well under 255 bytes with ".gguf" / ".json" / ".0.log"

_RULE = ("use letters, digits, '.', '_', '-', '/' between parts and one ':' before a tag "
         f"(at most {MAX_ID_LENGTH} characters, starting with a letter or digit)")


def id_problem(model_id: str) -> str | None:
    """None for a valid id, else what is wrong with it (a sentence for the user)."""
    if not model_id:
        return "a model id must not be empty"
    if len(model_id) > MAX_ID_LENGTH:
        return f"a model id is at most {MAX_ID_LENGTH} characters"
    if not _CHARS_RE.match(model_id):
        return _RULE
    name, _, tag = model_id.partition(":")
    if ":" in tag:
        return "a model id has at most one ':' (name:tag)"
    if model_id.endswith(":"):
        return "the tag after ':' must not be empty"
    if "/" in tag:
        return "the tag after ':' must not contain '/'"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "each '/'-separated part of a model id must be a non-empty name (not '.' or '..')"
    return None


def file_stem(model_id: str) -> str:
    """A file name (without extension) for ``model_id``: safe and one-to-one."""
    stem = "".join(c if c in _PLAIN else "".join(f"%{b:02X}" for b in c.encode()) for c in model_id)
    if len(stem) > _MAX_STEM:  # '~' never appears otherwise, the hash keeps it one-to-one
        stem = stem[:_MAX_STEM - 17] + "~" + hashlib.sha256(model_id.encode()).hexdigest()[:16]
    return stem


def id_from_file_stem(stem: str) -> str | None:
    """The id whose ``file_stem`` is ``stem`` (for files found on disk), or None."""
    if "~" in stem:
        return None
    try:
        model_id = _ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), stem)
    except ValueError:
        return None
    if "%" in model_id or id_problem(model_id) is not None or file_stem(model_id) != stem:
        return None
    return model_id
