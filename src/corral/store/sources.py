"""What a pull SOURCE names, and (in the fetch child only) which file that is.

Forms:
    owner/repo/path/file.gguf     one file of a Hugging Face repo
    owner/repo:Q4_K_M             the repo's file with that quantization tag (like
                                  llama.cpp's ``-hf``); ``owner/repo`` alone means Q4_K_M
    https://host/path/file.gguf   any http(s) URL
An ``hf.co/`` or ``huggingface.co/`` prefix is accepted on the Hub forms.

``parse_source`` is pure (the router calls it to reject bad input at once); its errors show
a URL redacted (corral.store.redaction).
``resolve`` talks to the Hub through huggingface_hub, so HF_TOKEN, HF_ENDPOINT and
HF_HOME work; it runs only in the fetch child.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from corral.model.ids import id_problem
from corral.store.local import model_id_from_filename
from corral.store.redaction import redact_url

__all__ = ["ParsedSource", "SourceError", "parse_source", "pick_file", "DEFAULT_TAG"]

DEFAULT_TAG = "Q4_K_M"
_REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_REPO_RE = re.compile(rf"^{_REPO_PART}/{_REPO_PART}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)

_EXAMPLES = ("use owner/repo/file.gguf, owner/repo:Q4_K_M, or an http(s) URL of a .gguf file")


class SourceError(ValueError):
    """The source string names nothing we can fetch. The message says why."""


@dataclass(frozen=True)
class ParsedSource:
    kind: Literal["hf_file", "hf_tag", "url"]
    repo: str | None = None
    filename: str | None = None  # path inside the repo, or the URL's last segment
    tag: str | None = None
    url: str | None = None
    name: str | None = None  # owner/repo[:TAG] as the user wrote it (hf_tag)

    @property
    def provisional_id(self) -> str:
        """The model id before the Hub answered (exact but for a file of a Hub repo
        named by tag whose name is not a valid id)."""
        if self.filename:
            return model_id_from_filename(self.filename)
        return self.model_id(None)

    def model_id(self, filename: str | None) -> str:
        """The id a pulled model gets: the name it was pulled by (``owner/repo:Q4_K_M``,
        as llama.cpp's router and Ollama name pulled models); a file or URL: its stem."""
        if self.kind == "hf_tag" and self.name is not None and id_problem(self.name) is None:
            return self.name
        if filename is not None:
            return model_id_from_filename(filename)
        assert self.repo is not None
        name = re.sub(r"[-_.]gguf$", "", self.repo.split("/")[1], flags=re.IGNORECASE)
        return model_id_from_filename(f"{name}-{self.tag or DEFAULT_TAG}")


def parse_source(source: str) -> ParsedSource:
    s = source.strip()
    if not s:
        raise SourceError(f"empty model source: {_EXAMPLES}")
    if re.match(r"^https?://", s, re.IGNORECASE):
        parts = urlsplit(s)
        name = unquote(parts.path.rsplit("/", 1)[-1])
        if not parts.netloc or not name.lower().endswith(".gguf"):
            raise SourceError(f"URL {redact_url(s)!r} does not name a .gguf file: {_EXAMPLES}")
        return ParsedSource("url", filename=name, url=s)
    if "://" in s:
        raise SourceError(f"unsupported URL scheme in {redact_url(s)!r}: {_EXAMPLES}")
    s = re.sub(r"^(?:https?://)?(?:hf\.co|huggingface\.co)/", "", s)
    if ":" in s:
        repo, tag = s.split(":", 1)
        if not _REPO_RE.match(repo) or not _TAG_RE.match(tag):
            raise SourceError(f"cannot read {source!r} as owner/repo:TAG: {_EXAMPLES}")
        return ParsedSource("hf_tag", repo=repo, tag=tag, name=source.strip())
    parts_ = s.split("/")
    if len(parts_) >= 3 and s.lower().endswith(".gguf"):
        repo = "/".join(parts_[:2])
        filename = "/".join(parts_[2:])
        if not _REPO_RE.match(repo) or ".." in parts_ or "" in parts_:
            raise SourceError(f"cannot read {source!r} as owner/repo/file.gguf: {_EXAMPLES}")
        return ParsedSource("hf_file", repo=repo, filename=filename)
    if _REPO_RE.match(s):
        return ParsedSource("hf_tag", repo=s, tag=None, name=source.strip())
    raise SourceError(f"cannot read model source {redact_url(source)!r}: {_EXAMPLES}")


def pick_file(files: list[str], tag: str | None, repo: str) -> str:
    """Choose the repo's .gguf file for a tag, the way llama.cpp's ``-hf`` does: the tag
    matched case-insensitively in the file name, mmproj files skipped, a single file
    preferred over a split one; no tag means Q4_K_M, else the first model file."""
    ggufs = sorted(f for f in files
                   if f.lower().endswith(".gguf") and "mmproj" not in Path(f).name.lower())
    if not ggufs:
        raise SourceError(f"repo {repo} has no .gguf model files")

    def matches(t: str) -> list[str]:
        pat = re.compile(rf"(?<![A-Za-z0-9]){re.escape(t)}(?![A-Za-z0-9])", re.IGNORECASE)
        return [f for f in ggufs if pat.search(Path(f).name)]

    want = tag or DEFAULT_TAG
    found = matches(want)
    if not found and tag is None:
        found = ggufs
    if not found:
        tags = sorted({q for f in ggufs if (q := _quant(f))})
        hint = f"; it has {', '.join(tags)}" if tags else ""
        raise SourceError(f"repo {repo} has no .gguf file with tag {want}{hint}")
    single = [f for f in found if not _SPLIT_RE.search(f)]
    if single:
        return single[0]
    first_parts = [f for f in found if _SPLIT_RE.search(f).group(1) == "00001"]  # type: ignore[union-attr]
    raise SourceError(
        f"repo {repo} has tag {want} only as a split GGUF ({Path(first_parts[0] if first_parts else found[0]).name}); "
        "split models are not supported yet: merge it with llama-gguf-split and put it in the models dir")


def pick_projector(files: list[str], model_file: str) -> str | None:
    """The repo's vision projector for ``model_file``, as llama.cpp's ``-hf`` pulls one: a
    ``.gguf`` named ``*mmproj*`` in the model file's folder; of several, the one with the
    model's quantization in its name, else F16, BF16, F32, else the first by name."""
    folder = str(Path(model_file).parent)
    found = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" in Path(f).name.lower()
                   and str(Path(f).parent) == folder)
    if not found:
        return None
    for want in (_quant(model_file), "F16", "BF16", "F32"):
        if want:
            pat = re.compile(rf"(?<![A-Za-z0-9]){re.escape(want)}(?![A-Za-z0-9])", re.IGNORECASE)
            hits = [f for f in found if pat.search(Path(f).name)]
            if hits:
                return hits[0]
    return found[0]


def _quant(name: str) -> str | None:
    from corral.store.gguf import quant_from_name

    return quant_from_name(Path(name).name)
