"""The wire types of llama-server's slot files (``POST /slots/{id}?action=save|restore|erase``).
Re-exported by ``corral.wire`` (import them from there). Imports nothing of corral.

    router                                      worker
      | -- SlotFileAction(save, slot, dir, name) -> |   (deferred while the slot is busy,
      | <------------ SlotFileDone ---------------- |    as llama-server defers it)

``directory`` is the server's ``slots/`` dir; ``filename`` a bare name the router checked
(``filename_problem``) and the worker checks again: the file is ``directory/filename``,
never anywhere else."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

__all__ = ["MAX_FILENAME_BYTES", "SlotFileAction", "SlotFileDone", "SlotFileError", "SlotFileVerb", "filename_problem"]

SlotFileVerb = Literal["save", "restore", "erase"]
SlotFileError = Literal[
    "",  # none
    "invalid_slot",  # no such slot in this worker
    "invalid_file",  # a bad name, no such file, or a file this model/settings cannot restore
    "server",  # the save failed (disk full, ...)
]


class SlotFileAction(msgspec.Struct, frozen=True, tag="slot_file", kw_only=True):
    id: str  # answered by the SlotFileDone of this id
    action: SlotFileVerb
    slot: Annotated[int, Meta(ge=0, le=1 << 16)]
    directory: str = ""  # save/restore: the slots/ directory
    filename: str = ""


class SlotFileDone(msgspec.Struct, frozen=True, tag="slot_file_done", kw_only=True):
    """The answer: llama-server's numbers (n_saved/n_restored/n_erased = ``n_tokens``,
    n_written/n_read = ``n_bytes``), or ``error`` != "" with its ``message``."""

    id: str
    action: SlotFileVerb
    slot: int
    n_tokens: int = 0
    n_bytes: int = 0
    ms: float = 0.0
    error: SlotFileError = ""
    message: str = ""


# NAME_MAX (255) less what the worker adds for its temporary names (worker/cache/slot_files.py:
# ".NAME.corral" plus ".PID.NS.tmp", at most 41 bytes): every name the worker makes fits
MAX_FILENAME_BYTES = 200


def filename_problem(name: str) -> str | None:
    """Why ``name`` cannot be a slot file's name (None: it can). A bare file name only:
    no path separator, no ``..``, no leading dot (the sidecars and temp files), no control
    characters, at most ``MAX_FILENAME_BYTES``; the rules of llama-server's
    ``fs_validate_filename`` and stricter."""
    if not name:
        return "the filename is empty"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES:
        return f"the filename is longer than {MAX_FILENAME_BYTES} bytes"
    if "/" in name or "\\" in name:
        return "the filename has a path separator"
    if ".." in name:
        return "the filename has '..'"
    if name.startswith("."):
        return "the filename starts with '.'"
    if name != name.strip() or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "the filename has control characters or surrounding spaces"
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name) or ":" in name:
        return "the filename has a character not allowed in file names"
    return None
