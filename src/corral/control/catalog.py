"""The catalog: which models the router can serve, by id and alias.

Sources, in order of precedence (an id taken by an earlier source is skipped later):
``config`` ([models.ID] tables), ``nitro`` (POST /inferences/llamacpp/loadmodel),
``store`` (every .gguf under models_dir and every pulled model), ``embedded``
(gemma-3-270m, alias ``default``). A ``ModelSpec`` is immutable; reload replaces it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from corral import wire
from corral.config.file import CorralConfig
from corral.control.placement.gpu_slot import GpuSlot
from corral.errors import ModelNotFound
from corral.model.settings import ModelSettings
from corral.store.local import LLAMA_CACHE_SOURCE, ModelStore, default_models_dir
from corral.store.projector import projector_for

__all__ = ["ModelSpec", "Catalog", "specs_from_config", "default_threads"]

log = logging.getLogger("corral.catalog")

class ModelSpec(ModelSettings, frozen=True, kw_only=True):
    """One model the router can serve: its settings plus its id, file, aliases, source."""

    id: str
    path: Path
    aliases: tuple[str, ...] = ()
    source: str = "config"
    # why its file does not read as GGUF when the catalog was read (corral.store.gguf.check_file):
    # the model is listed with status "failed" and this reason, and is never handed to a worker
    problem: str | None = None
    # a Hub source this model's file is pulled from, under its id, when first needed
    # (a preset's hf-repo; api/core/target.py starts it); None: the file is there
    pull: str | None = None

    @classmethod
    def make(cls, model_id: str, path: Path, settings: ModelSettings, *,
             aliases: tuple[str, ...] = (), source: str, projector: Path | None = None,
             problem: str | None = None, pull: str | None = None) -> "ModelSpec":
        """``mmproj`` becomes the projector's path, or None (corral.store.projector's rule;
        ``projector``: the one pulled with the model)."""
        fields = settings.to_dict()
        found = projector_for(Path(path), settings.mmproj, projector) if problem is None else None
        fields["mmproj"] = str(found) if found is not None else None
        return cls(id=model_id, path=Path(path), aliases=tuple(aliases), source=source, problem=problem,
                   pull=pull, **fields)

    def projector_bytes(self) -> int:
        """The projector file's size (0 without one, or while it is missing)."""
        try:
            return os.path.getsize(self.mmproj) if self.mmproj else 0
        except OSError:
            return 0

    def lora_bytes(self) -> int:
        """The LoRA adapter files' sizes (llama.cpp puts each tensor beside the layer it adapts)."""
        total = 0
        for a in self.lora:
            try:
                total += os.path.getsize(a.path)
            except OSError:
                pass
        return total

    def first_gpu_bytes(self) -> int:
        """What the router charges the first GPU of an instance beside its layers: the vision
        projector (libmtmd's device) and the LoRA adapters (there in full: an estimate that is
        exact on one GPU); the worker plans its layers in the rest."""
        return self.projector_bytes() + self.lora_bytes()

    def worker_key(self) -> tuple[Any, ...]:
        """What a running worker depends on: a change restarts it."""
        return (self.path, *super().worker_key())

    def load_key(self) -> tuple[Any, ...]:
        """What a load fixes: equal ones are variants of one loaded model (control/plane.py's serving)."""
        return (self.path, *super().load_key())

    def worker_settings(self, index: int, threads: int | None, gpu: GpuSlot | None = None) -> wire.WorkerSettings:
        """One spawn's settings; ``gpu``: where admission placed it (its GPUs and budget)."""
        fields = self.to_dict()
        fields.update(threads=threads, threads_batch=self.threads_batch or threads)
        if gpu is not None:  # the projector and adapters take their room on the first GPU: the layers plan in the rest
            proj, budgets = self.first_gpu_bytes(), gpu.budgets
            if proj and budgets:
                budgets = [max(0, budgets[0] - proj), *budgets[1:]]
            fields.update(devices=gpu.devices, gpu_budget_bytes=budgets, gpu_margin_bytes=gpu.margin_bytes)
            if gpu.split is not None:  # where its need was estimated: the worker splits the same way
                fields.update(tensor_split=gpu.split)
        return wire.WorkerSettings(model_id=self.id, model_path=str(self.path), instance=index,
                                   **fields)


def default_threads(spec: ModelSpec, max_loaded_models: int, n_models: int,
                    *, adaptive: bool | None = None) -> int:
    """Threads per worker when the config gives none.

    Where workers adapt their decode threads to the cores other processes leave free
    (Linux, unless CORRAL_ADAPTIVE_THREADS=0; see corral.worker.host.cpu), every worker gets
    all cores and lowers them itself while other workers are busy: a model alone runs at
    full speed, two busy models settle at a core each. Measured on 2 cores, 2 models,
    c=8 alone / c=4 each together: all cores + adaptive 169-177 / 109-129 tok/s; a
    static split (1 thread each) 102 / 121.

    Elsewhere: the cores divided among the worker processes that may decode at the same
    time (this model's instances times the models that may be loaded together), at
    least 1, since oversubscribed cores cost far more than idle ones (2 workers x 2
    threads on 2 cores ran at a third of the speed of 2 x 1 thread)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if adaptive is None:
        adaptive = sys.platform == "linux" and os.environ.get("CORRAL_ADAPTIVE_THREADS", "1") != "0"
    if adaptive:
        return max(1, cores)
    concurrent_models = max(1, min(max_loaded_models, n_models))
    return max(1, cores // (spec.instances * concurrent_models))


def specs_from_config(cfg: CorralConfig, store_models: list[Any] | None = None,
                      embedded: tuple[str, Path, tuple[str, ...]] | None = None,
                      problems: Mapping[Path, str] | None = None) -> list[ModelSpec]:
    """The specs of the config's models, the store's and the embedded one; ``problems``: why a
    config model's file does not read (by path), a store model's is its own ``problem``."""
    specs: list[ModelSpec] = []
    taken: set[str] = set()
    problems = problems or {}
    pulled = {lm.id: lm for lm in store_models or []}
    for mid, m in cfg.models.items():
        path, projector, problem = m.path, None, problems.get(m.path) if m.path is not None else None
        if path is None:  # pulled under its id: the store's file once there, else where it will land
            have = pulled.get(mid)
            path = have.path if have is not None else pull_target(cfg, mid)
            projector = have.mmproj if have is not None else None
            problem = have.problem if have is not None else None
        specs.append(ModelSpec.make(mid, path, cfg.model_settings(mid), aliases=tuple(m.aliases),
                                    source="config" if m.origin is None else "preset", projector=projector,
                                    problem=problem, pull=m.pull))
        taken.add(mid)
        taken.update(m.aliases)
    inherited = cfg.inherited_settings()
    for lm in store_models or []:
        if lm.id in taken:
            continue
        specs.append(ModelSpec.make(lm.id, lm.path, inherited,
                                    source=lm.source if lm.source == LLAMA_CACHE_SOURCE else "store",
                                    projector=lm.mmproj, problem=lm.problem))
        taken.add(lm.id)
    if embedded is not None:
        eid, epath, ealiases = embedded
        if eid not in taken:
            free_aliases = tuple(a for a in ealiases if a not in taken)
            specs.append(ModelSpec.make(eid, epath, inherited, aliases=free_aliases,
                                        source="embedded"))
    return specs


def pull_target(cfg: CorralConfig, model_id: str) -> Path:
    """Where the store puts the file of a model pulled under ``model_id``."""
    return ModelStore(cfg.server.models_dir or default_models_dir()).model_file_path(model_id)


class Catalog:
    """Model specs by id, with an alias index. Mutated only from the event loop."""

    def __init__(self, specs: Iterable[ModelSpec] = ()) -> None:
        self._specs: dict[str, ModelSpec] = {}
        self._names: dict[str, str] = {}
        for s in specs:
            self.put(s)

    def put(self, spec: ModelSpec) -> None:
        old = self._specs.get(spec.id)
        if old is not None:
            for a in old.aliases:
                self._names.pop(a, None)
        self._specs[spec.id] = spec
        self._names[spec.id] = spec.id
        for a in spec.aliases:
            if self._names.get(a, spec.id) != spec.id:
                log.warning("alias %r of %s already names %s; ignored", a, spec.id, self._names[a])
                continue
            self._names[a] = spec.id

    def remove(self, model_id: str) -> ModelSpec | None:
        spec = self._specs.pop(model_id, None)
        if spec is not None:
            for name in [n for n, mid in self._names.items() if mid == model_id]:
                del self._names[name]
        return spec

    def resolve_id(self, name: str) -> str:
        """Id for an id or alias; a trailing .gguf is tolerated, and Ollama's implicit tag:
        ``name`` finds ``name:latest`` and ``name:latest`` finds ``name``. ModelNotFound otherwise."""
        mid = self._names.get(name)
        if mid is None and name.endswith(".gguf"):
            mid = self._names.get(name[:-5])
        if mid is None and name.endswith(":latest"):
            mid = self._names.get(name[:-7])
        elif mid is None and ":" not in name:
            mid = self._names.get(name + ":latest")
        if mid is None:
            raise ModelNotFound(f"model {name!r} not found; GET /v1/models lists the models",
                                param="model")
        return mid

    def get(self, model_id: str) -> ModelSpec | None:
        return self._specs.get(model_id)

    def __contains__(self, model_id: str) -> bool:
        return model_id in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(list(self._specs.values()))

    def __len__(self) -> int:
        return len(self._specs)
