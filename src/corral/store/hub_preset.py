"""Presets from the Hub: ``corral serve -hf user/repo`` where the repo holds a ``preset.ini``
(llama.cpp's Hub presets, ``ggml-org/test-preset-ci``), ``-hf user/repo:NAME`` one preset
of it. A repo without ``preset.ini`` is a model (``:TAG`` its quantization), pulled as any.

``fetch_preset`` reads the one file over HTTPS from ``$HF_ENDPOINT`` (default the Hub),
with ``$HF_TOKEN`` when set, at most ``MAX_PRESET_BYTES``; ``hub_preset`` keeps it in the
state directory (owner-only) as the server's ``models_preset``, so a reload re-reads that
copy and a restart fetches it again. Its sections' ``hf-repo`` models are pulled through
the store when a request first needs one (corral.api.core.target), never at startup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx

from corral.config.preset import MAX_PRESET_BYTES, parse_preset, select_section
from corral.errors import ConfigError
from corral.model.ids import file_stem
from corral.state.paths import private_dir

__all__ = ["HubPreset", "fetch_preset", "hub_preset", "split_hf"]

PRESET_FILE = "preset.ini"


@dataclass(frozen=True)
class HubPreset:
    repo: str
    path: Path | None  # the preset's copy in the state directory; None: the repo has none (a model)
    section: str | None  # -hf user/repo:NAME with a preset: that preset


def split_hf(spec: str) -> tuple[str, str | None]:
    """``user/repo[:suffix]`` -> (repo, suffix); ``ConfigError`` for anything else."""
    text = spec.strip()
    for prefix in ("https://huggingface.co/", "huggingface.co/", "hf.co/"):
        text = text.removeprefix(prefix)
    repo, _, suffix = text.partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(c in repo for c in " \\?#"):
        raise ConfigError(f"-hf {spec!r}: expected user/repo or user/repo:NAME")
    return repo, suffix or None


def fetch_preset(repo: str, *, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None) -> str | None:
    """The text of the repo's ``preset.ini``; None when it has none (404)."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    headers = {"User-Agent": "corral"}
    token = os.environ.get("HF_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{endpoint}/{repo}/resolve/main/{PRESET_FILE}"
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=True, transport=transport) as client, \
                client.stream("GET", url, headers=headers) as r:
            if r.status_code == 404:
                return None
            if r.status_code in (401, 403):
                raise ConfigError(f"-hf {repo}: the Hub refused access to {PRESET_FILE} ({r.status_code}); "
                                  "set HF_TOKEN for a gated or private repo")
            if r.status_code != 200:
                raise ConfigError(f"-hf {repo}: the Hub answered {r.status_code} for {PRESET_FILE}")
            body = bytearray()
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > MAX_PRESET_BYTES:
                    raise ConfigError(f"-hf {repo}: {PRESET_FILE} is larger than {MAX_PRESET_BYTES} bytes")
    except httpx.HTTPError as exc:
        raise ConfigError(f"-hf {repo}: cannot reach the Hub ({endpoint}): {exc}") from None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"-hf {repo}: {PRESET_FILE} is not UTF-8 text") from None


def hub_preset(spec: str, state: Path, *, transport: httpx.BaseTransport | None = None) -> HubPreset:
    """Fetch ``spec``'s preset into ``state``/presets/ (checked whole first: a bad preset
    writes nothing); ``path`` None when the repo has no preset."""
    repo, suffix = split_hf(spec)
    text = fetch_preset(repo, transport=transport)
    if text is None:
        return HubPreset(repo, None, None)
    name = f"{repo} ({PRESET_FILE})"
    parse_preset(text, name=name, base=Path.cwd(), only=suffix)  # ConfigError before anything is kept
    if suffix is not None:
        text = select_section(text, suffix)
    folder = private_dir(state / "presets")
    target = folder / f"{file_stem(repo + (':' + suffix if suffix else ''))}.ini"
    tmp = target.with_suffix(".ini.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, target)
    return HubPreset(repo, target, suffix)
