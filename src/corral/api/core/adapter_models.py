"""Adapter model ids: a model id that a LoRA adapter of another model declares (``lora =
[{id, path, scale, model = "base-ft"}]``, Ollama's ``ADAPTER`` models). Such an id is served
by the base's workers with only that adapter at its scale (corral.api.core.lora.route), and
listed by every model list next to the catalog's models (``GET /v1/models``, ``/api/tags``,
``GET /models``, the page) with its base named. Loading, unloading and keeping alive one
(``POST /models/load|unload``, Ollama's empty-prompt load and ``keep_alive``) act on its base;
``/api/ps`` lists it while its base is loaded.

Who sees one: a key sees an adapter model when one of its ``models`` patterns matches the
adapter's id and it sees the base (the request runs on the base's workers, and may name its
own ``lora`` scales there); a key that sees neither, or only one of them, gets the 404 of an
unknown name and no list entry. An adapter id that is also a catalog model's id or alias is
that model, not the adapter (it is neither listed nor routed as one).

See docs/internals/lora.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from corral.control.plane import ControlPlane
from corral.control.scheduling.pool import ModelPool
from corral.errors import ModelNotFound
from corral.model.settings import LoraAdapter

__all__ = ["AdapterModel", "adapter_models", "find_adapter_model", "serving_model", "adapter_file_size"]


class AdapterModel(NamedTuple):
    id: str  # the adapter's ``model``
    base: ModelPool
    position: int  # the adapter's position in the base's ``lora``
    adapter: LoraAdapter

    def describe(self) -> dict[str, object]:
        """The ``adapter`` object the model lists add to such an entry."""
        a = self.adapter
        return {"base": self.base.spec.id, "id": a.id, "index": self.position, "scale": a.scale, "path": a.path}


def _is_catalog_name(plane: ControlPlane, name: str) -> bool:
    try:
        plane.catalog.resolve_id(name)
    except ModelNotFound:
        return False
    return True


def adapter_models(plane: ControlPlane) -> list[AdapterModel]:
    """The adapter models the current request's key may use (all of them outside a request),
    in the order of their bases and then of the bases' ``lora`` lists."""
    out = []
    for pool in plane.visible_pools():
        for i, a in enumerate(pool.spec.lora):
            if a.model is not None and plane.access.visible_id(a.model) and not _is_catalog_name(plane, a.model):
                out.append(AdapterModel(a.model, pool, i, a))
    return out


def find_adapter_model(plane: ControlPlane, name: str) -> AdapterModel | None:
    """The adapter model ``name`` (or ``name`` less Ollama's ``:latest``) names, if the
    request's key may use it."""
    bare = name[:-7] if name.endswith(":latest") else name
    return next((m for m in adapter_models(plane) if m.id in (name, bare)), None)


def serving_model(plane: ControlPlane, name: str) -> str:
    """The catalog model that serves ``name``: ``name`` itself for a catalog model or alias,
    the base's id for an adapter model the request's key may use (loading, unloading or
    keeping alive an adapter model is doing it to its base's workers), else ``name`` (the
    caller's lookup gives the 404 of an unknown name)."""
    if _is_catalog_name(plane, name):
        return name
    found = find_adapter_model(plane, name)
    return name if found is None else found.base.spec.id


def adapter_file_size(m: AdapterModel) -> tuple[int, float]:
    """(bytes, mtime) of the adapter's file; (0, 0.0) when it is not there."""
    try:
        st = Path(m.adapter.path).stat()
    except OSError:
        return 0, 0.0
    return st.st_size, st.st_mtime
