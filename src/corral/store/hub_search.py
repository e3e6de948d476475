"""Finding GGUF models on the Hugging Face Hub: ``search`` (repositories matching a text) and
``repo_quants`` (a repository's quantizations, each a single file or a split one, with sizes
and the vision/audio projector a pull would bring along).

Both go through huggingface_hub's ``HfApi`` as pulls do (``corral.store.fetch_resolve``):
``HF_ENDPOINT`` and ``HF_TOKEN`` apply. Synchronous: the router calls them in a thread with
a time limit (``corral.api.page.hub``). What they keep is bounded: ``MAX_HITS`` repositories,
``MAX_FILES`` files of a repository (a larger listing is cut and says so).
Failures are ``HubError`` with a message for a person.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import PurePosixPath
from typing import Any

from corral.store.gguf import quant_from_name
from corral.store.sources import pick_projector

__all__ = ["HubError", "RepoHit", "Quant", "RepoListing", "search", "repo_quants", "MAX_HITS", "MAX_FILES",
           "MAX_QUERY"]

MAX_HITS = 50
MAX_FILES = 2000
MAX_QUERY = 200  # characters of search text
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


class HubError(Exception):
    """The Hub did not answer as asked. ``status``: the HTTP status for the caller (404 for a
    repository that is not there, 502 when the Hub failed or could not be reached)."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class RepoHit:
    id: str
    downloads: int
    likes: int
    updated: str | None  # ISO 8601
    license: str | None
    projector: bool  # an mmproj*.gguf is there (vision or audio input)
    gguf_files: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Quant:
    """One quantization of a repo: one file, or the parts of a split one in order."""

    tag: str  # Q4_K_M ... or the file name's stem when it names none
    files: list[str]
    size: int
    sha256: list[str | None]
    split: bool
    projector: str | None = None  # what a pull of it brings along
    projector_size: int = 0
    source: str = ""  # what to pull: owner/repo:TAG, or owner/repo/file.gguf; "" for a split model (not pullable yet)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class RepoListing:
    repo: str
    quants: list[Quant] = field(default_factory=list)
    projectors: list[str] = field(default_factory=list)
    files: int = 0
    truncated: bool = False  # more than MAX_FILES files: the rest not listed


def _hub_error(exc: Exception, what: str) -> HubError:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    if isinstance(exc, OfflineModeIsEnabled):
        return HubError("HF_HUB_OFFLINE is set: this server does not ask the Hub", 503)
    if isinstance(exc, GatedRepoError):
        return HubError(f"{what} is gated: accept its license on the Hub and set HF_TOKEN", 403)
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(f"{what} was not found on the Hub (if it is private, set HF_TOKEN)", 404)
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        return HubError(f"the Hub answered HTTP {status} for {what}", 502)
    return HubError(f"cannot reach the Hub for {what} ({type(exc).__name__})", 502)


def search(text: str, limit: int = 30) -> list[RepoHit]:
    """GGUF repositories whose name matches ``text`` (or holds each of its words), most
    downloaded first."""
    from huggingface_hub import HfApi

    text = text.strip()
    if not text or len(text) > MAX_QUERY:
        raise HubError(f"search text: 1 to {MAX_QUERY} characters", 400)
    limit = min(limit, MAX_HITS)
    api = HfApi()

    def ask(words: str, n: int) -> list[Any]:
        try:
            return list(islice(api.list_models(
                search=words, filter="gguf", sort="downloads", limit=n,
                expand=["downloads", "likes", "lastModified", "tags", "siblings", "cardData"]), n))
        except Exception as exc:  # noqa: BLE001 - every failure of the Hub's answer becomes a HubError
            raise _hub_error(exc, f"search {text!r}") from None

    found = ask(text, limit)
    words = [w.lower() for w in text.split()]
    if len(words) > 1 and len(found) < limit:
        # the Hub matches the text as one piece of a repo's name: "qwen coder" finds no
        # "Qwen2.5-Coder"; the repos matching its longest word that hold every word, too
        seen = {m.id for m in found}
        found += [m for m in ask(max(words, key=len), MAX_HITS * 2)
                  if m.id not in seen and all(w in m.id.lower() for w in words)][:limit - len(found)]
    hits = []
    for m in found:
        names = [s.rfilename for s in (m.siblings or [])[:MAX_FILES]]
        ggufs = [n for n in names if n.lower().endswith(".gguf")]
        hits.append(RepoHit(id=m.id, downloads=int(m.downloads or 0), likes=int(m.likes or 0),
                            updated=m.last_modified.isoformat() if m.last_modified else None,
                            license=_license(m), projector=any(_is_projector(n) for n in ggufs),
                            gguf_files=len(ggufs)))
    return hits


def _license(m: Any) -> str | None:
    for t in m.tags or []:
        if isinstance(t, str) and t.startswith("license:"):
            return t.split(":", 1)[1]
    card = getattr(m, "card_data", None)
    lic = card.get("license") if card is not None else None
    return str(lic) if lic else None


def _is_projector(name: str) -> bool:
    return "mmproj" in PurePosixPath(name).name.lower()


def repo_quants(repo: str) -> RepoListing:
    """The quantizations of ``repo`` (``owner/name``), largest last; each with the projector a
    pull of it brings along (``pick_projector``, as pulls choose it)."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    try:
        entries = list(islice(HfApi().list_repo_tree(repo, recursive=True), MAX_FILES + 1))
    except Exception as exc:  # noqa: BLE001 - every failure of the Hub's answer becomes a HubError
        raise _hub_error(exc, f"repo {repo}") from None
    out = RepoListing(repo=repo, files=min(len(entries), MAX_FILES), truncated=len(entries) > MAX_FILES)
    files = {e.path: e for e in entries[:MAX_FILES] if isinstance(e, RepoFile) and e.path.lower().endswith(".gguf")}
    out.projectors = sorted(p for p in files if _is_projector(p))
    groups: dict[str, list[str]] = {}
    for path in sorted(files):
        if _is_projector(path):
            continue
        m = _SPLIT.search(path)
        groups.setdefault(path[:m.start()] if m else path, []).append(path)
    names = list(files)
    for base, parts in groups.items():
        split = len(parts) > 1 or bool(_SPLIT.search(parts[0]))
        name = PurePosixPath(base).name
        tag = quant_from_name(name if name.lower().endswith(".gguf") else name + ".gguf") or \
            PurePosixPath(name).stem
        proj = pick_projector(names, parts[0])
        q = Quant(tag=tag, files=parts, size=sum(int(files[p].size) for p in parts),
                  sha256=[_sha(files[p]) for p in parts], split=split,
                  projector=proj, projector_size=int(files[proj].size) if proj else 0)
        # a split model is not pulled yet (sources.pick_file says so): no source to pull it by
        q.source = "" if split else _source(repo, tag, parts[0], [g[0] for g in groups.values()])
        out.quants.append(q)
    out.quants.sort(key=lambda q: q.size)
    return out


def _sha(f: Any) -> str | None:
    lfs = getattr(f, "lfs", None)
    return str(lfs.sha256) if lfs is not None else None


def _source(repo: str, tag: str, path: str, firsts: list[str]) -> str:
    """``owner/repo:TAG`` when the tag names this file alone (a pull brings the projector with
    it), else the file itself."""
    from corral.store.sources import SourceError, pick_file

    try:
        if pick_file(firsts, tag, repo) == path:
            return f"{repo}:{tag}"
    except SourceError:
        pass
    return f"{repo}/{path}"
