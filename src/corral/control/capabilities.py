"""What a model can do beyond plain text, asked the one way: a loaded instance's report
says (``wire.ModelInfo``), else the model's settings and file say (the GGUF metadata,
cached by ``corral.store.gguf_meta``; the projector ``corral.store.projector`` found).

Used by Ollama's ``/api/show`` capabilities, llama-server's model choice for /infill and
/rerank, ``GET /models``, ``/v1/models``, ``/props`` and the page (``vision``, ``audio``), and
the router's check that a request with images (audio) goes to a model that sees (hears) them.
Before a load, the projector's header says which encoders it has (``clip.has_vision_encoder``,
``clip.has_audio_encoder``, as libmtmd reads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from corral import wire
from corral.control.scheduling.pool import ModelPool
from corral.store.gguf_meta import GGUFMetadata, read_metadata

__all__ = ["Task", "can", "loaded_info", "projector_encoders"]

Task = Literal["infill", "rerank", "vision", "audio"]

_RANK = 4  # LLAMA_POOLING_TYPE_RANK
_UNREAD = object()


def loaded_info(pool: ModelPool) -> wire.ModelInfo | None:
    """The first loaded instance's report, or None."""
    return next((i.info for i in pool.instances if i.info is not None), None)


def projector_encoders(path: Path | str) -> tuple[bool, bool]:
    """(vision, audio): the encoders a projector file has (a header without the keys is an
    image projector, as the first conversions wrote them; an unreadable one: images, as before)."""
    meta = read_metadata(Path(path))
    if meta is None:
        return True, False
    return (bool(meta.values.get("clip.has_vision_encoder", True)),
            bool(meta.values.get("clip.has_audio_encoder", False)))


def can(pool: ModelPool, task: Task, meta: GGUFMetadata | None | object = _UNREAD) -> bool:
    """Whether ``pool``'s model does ``task``. ``meta``: its file's metadata where the
    caller read it already (None: unreadable); otherwise it is read (blocking, cached) when
    needed. ``vision`` and ``audio`` read the projector's header, not the model's: a
    projector is set or found, or a loaded instance says what it has."""
    info = loaded_info(pool)
    if info is not None:
        if task in ("vision", "audio"):
            return info.vision if task == "vision" else info.audio
        return info.fim if task == "infill" else info.pooling == "rank"
    spec = pool.spec
    if task in ("vision", "audio"):  # an embedding model loads no projector
        if not spec.mmproj or spec.embedding:
            return False
        return projector_encoders(spec.mmproj)[0 if task == "vision" else 1]
    if task == "rerank" and spec.pooling is not None:
        return spec.pooling == "rank"
    found = read_metadata(spec.path) if meta is _UNREAD else meta
    if not isinstance(found, GGUFMetadata):
        return False
    if task == "infill":
        return found.has_fim
    return found.values.get(f"{found.architecture}.pooling_type") == _RANK
