"""What a model can do beyond plain text, asked the one way: a loaded instance's report
says (``wire.ModelInfo``), else the model's settings and file say (the GGUF metadata,
cached by ``corral.store.gguf_meta``; the projector ``corral.store.projector`` found).

Used by Ollama's ``/api/show`` capabilities, llama-server's model choice for /infill and
/rerank, ``GET /models``, ``/v1/models`` and the page (``vision``), and the router's check
that a request with images goes to a model that sees them.
"""

from __future__ import annotations

from typing import Literal

from corral import wire
from corral.control.scheduling.pool import ModelPool
from corral.store.gguf_meta import GGUFMetadata, read_metadata

__all__ = ["Task", "can", "loaded_info"]

Task = Literal["infill", "rerank", "vision"]

_RANK = 4  # LLAMA_POOLING_TYPE_RANK
_UNREAD = object()


def loaded_info(pool: ModelPool) -> wire.ModelInfo | None:
    """The first loaded instance's report, or None."""
    return next((i.info for i in pool.instances if i.info is not None), None)


def can(pool: ModelPool, task: Task, meta: GGUFMetadata | None | object = _UNREAD) -> bool:
    """Whether ``pool``'s model does ``task``. ``meta``: its file's metadata where the
    caller read it already (None: unreadable); otherwise it is read (blocking, cached) when
    needed. ``vision`` never reads the file: a projector is set or found, or a loaded
    instance says it has one."""
    info = loaded_info(pool)
    if info is not None:
        return info.fim if task == "infill" else info.pooling == "rank" if task == "rerank" else info.vision
    spec = pool.spec
    if task == "vision":  # an embedding model loads no projector
        return bool(spec.mmproj) and not spec.embedding
    if task == "rerank" and spec.pooling is not None:
        return spec.pooling == "rank"
    found = read_metadata(spec.path) if meta is _UNREAD else meta
    if not isinstance(found, GGUFMetadata):
        return False
    if task == "infill":
        return found.has_fim
    return found.values.get(f"{found.architecture}.pooling_type") == _RANK
