"""Models made with Ollama's create (``POST /api/create``, ``corral create NAME -f
Modelfile``), kept across restarts in ``state_dir/created-models.json`` (owner-only,
written whole to a temporary file and renamed).

A record is what the model is: its name, its file (a model it was made from, or an
uploaded blob), the settings its Modelfile gave (``ModelSettings`` keys: generation
defaults, system, opening messages, adapters...), its license and what it was made from.
``CreatedModels`` is the one owner of that file; the API adds each record to the catalog
as a model of source ``created`` (at startup, and when one is made).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import msgspec

from corral.model.ids import id_problem
from corral.model.settings import ModelSettings, SettingsError
from corral.state.paths import private_dir

__all__ = ["CreatedModel", "CreatedModels", "FILE_NAME"]

log = logging.getLogger("corral.control")

FILE_NAME = "created-models.json"


class CreatedModel(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    path: str  # the GGUF file
    settings: dict[str, Any] = {}  # ModelSettings keys, as given
    parent: str | None = None  # the model it was made from (FROM a model), None: from a file
    license: list[str] = []
    mmproj: str | None = None

    def files(self) -> set[str]:
        """The files it runs on: its GGUF, its projector and its adapters'."""
        lora = self.settings.get("lora") or []
        return {self.path, *([self.mmproj] if self.mmproj else []),
                *(a["path"] for a in lora if isinstance(a, dict) and isinstance(a.get("path"), str))}

    def model_settings(self, base: ModelSettings | None = None) -> ModelSettings:
        """Its settings over ``base`` (SettingsError for bad ones)."""
        return ModelSettings.layered([base.to_dict() if base is not None else {}, self.settings])


class CreatedModels:
    def __init__(self, state: Path) -> None:
        self.file = state / FILE_NAME

    def load(self) -> list[CreatedModel]:
        """Every record that still makes a model (a broken one is logged and skipped)."""
        try:
            raw = json.loads(self.file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("%s: cannot read the created models: %s", self.file, exc)
            return []
        out = []
        for item in raw if isinstance(raw, list) else []:
            try:
                rec = msgspec.convert(item, CreatedModel)
                if id_problem(rec.name) is not None:
                    raise ValueError(f"invalid name {rec.name!r}")
                rec.model_settings()
            except (msgspec.ValidationError, ValueError, SettingsError) as exc:
                log.warning("%s: skipping a created model: %s", self.file, exc)
                continue
            out.append(rec)
        return out

    def put(self, rec: CreatedModel) -> None:
        self._write([r for r in self.load() if r.name != rec.name] + [rec])

    def remove(self, name: str) -> bool:
        recs = self.load()
        kept = [r for r in recs if r.name != name]
        if len(kept) == len(recs):
            return False
        self._write(kept)
        return True

    def _write(self, recs: list[CreatedModel]) -> None:
        private_dir(self.file.parent)
        tmp = self.file.with_suffix(".json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(recs))
        os.replace(tmp, self.file)
