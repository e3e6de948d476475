"""The download child's first step: what a source names (the file, its size and
sha256, where its bytes come from), from the Hugging Face Hub (or its local cache) or
a plain URL. Failures are ``Fail`` (final, with a kind) or ``Retryable`` (store/fetch_errors.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec

from corral.store import messages as m
from corral.store.fetch_errors import Fail, Retryable
from corral.store.address_policy import parse_setting
from corral.store.redaction import redact_url
from corral.store.sources import ParsedSource, SourceError, parse_source, pick_file, pick_projector

__all__ = ["Target", "resolve", "host_of", "raise_for_status", "is_sha256"]

T = TypeVar("T")
_SHA_LEN = 64


def is_sha256(s: str | None) -> bool:
    return s is not None and len(s) == _SHA_LEN and all(c in "0123456789abcdef" for c in s.lower())


class Target(msgspec.Struct, kw_only=True):
    filename: str
    key: str
    url: str | None
    headers: dict[str, str] = {}
    total: int | None = None
    sha256: str | None = None
    cached_path: str | None = None
    projector: "Target | None" = None  # the repo's vision projector, pulled with the model (:TAG form)
    guarded: bool = False  # a URL a client named: fetched under the address policy (store/fetch_http.py)


def _hub_errors(exc: Exception, what: str) -> Fail | Retryable:
    """A huggingface_hub exception as the end of this pull (Fail) or a retry."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, OfflineModeIsEnabled):
        return Fail("network", f"HF_HUB_OFFLINE is set and {what} is not in the Hugging Face "
                    "cache")
    if isinstance(exc, GatedRepoError):
        return Fail("unauthorized", f"{what} is gated: accept its license on the Hub and set "
                    "HF_TOKEN to a token of that account")
    if isinstance(exc, RepositoryNotFoundError):
        return Fail("not_found", f"{what} was not found on the Hub (if it is private, set "
                    "HF_TOKEN to a token that can read it)")
    if isinstance(exc, RevisionNotFoundError):
        return Fail("not_found", f"{what}: revision not found")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return Fail("unauthorized", f"access to {what} denied (HTTP {status}): it is gated "
                        "or private; set HF_TOKEN to a token that can read it")
        if status == 404:
            return Fail("not_found", f"{what} was not found on the Hub (HTTP 404)")
        if status is not None and (status >= 500 or status == 429):
            return Retryable(f"the Hub answered HTTP {status} for {what}")
        return Fail("internal", f"the Hub refused {what}: {exc}")
    return Retryable(f"cannot reach the Hub for {what}: {exc}")


def _with_retries(req: m.FetchRequest, fn: Callable[[], T], what: str) -> T:
    attempt = 0
    while True:
        try:
            return fn()
        except Fail:
            raise
        except Exception as exc:
            err = _hub_errors(exc, what) if not isinstance(exc, Retryable) else exc
            if isinstance(err, Fail):
                raise err from exc
            attempt += 1
            if attempt > req.retries:
                raise Fail("network", f"{err} (gave up after {attempt} attempts)") from exc
            time.sleep(req.retry_backoff_s * 2 ** (attempt - 1))


def _resolve_hub(req: m.FetchRequest, src: ParsedSource) -> Target:
    from huggingface_hub import HfApi

    repo = src.repo
    assert repo is not None
    filename = src.filename
    projector = None
    if filename is None:  # the :TAG form: list the repo and pick a file (and its projector)
        api = HfApi()
        try:
            files = _with_retries(req, lambda: api.list_repo_files(repo), f"repo {repo}")
        except Fail as exc:
            files = _cached_listing(repo) if exc.kind == "network" else []
            if not files:
                raise  # offline and nothing of this repo in the cache
        try:
            filename = pick_file(files, src.tag, repo)
        except SourceError as exc:
            raise Fail("invalid", str(exc)) from exc
        projector = pick_projector(files, filename)
    target = _hub_target(req, repo, filename)
    if projector is not None:
        target.projector = _hub_target(req, repo, projector)
    return target


def _hub_target(req: m.FetchRequest, repo: str, filename: str) -> Target:
    """One file of a Hub repo: in the HF cache already, else its URL, size and sha256."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.utils import build_hf_headers

    key = f"hf:{repo}/{filename}"
    cached = try_to_load_from_cache(repo, filename)
    if isinstance(cached, str) and os.path.isfile(cached):
        blob = os.path.basename(os.path.realpath(cached))
        return Target(filename=filename, key=key, url=None, total=os.path.getsize(cached),
                       sha256=blob if is_sha256(blob) else None, cached_path=cached)
    url = hf_hub_url(repo, filename)
    meta = _with_retries(req, lambda: get_hf_file_metadata(url, timeout=req.timeout_s),
                         f"{repo}/{filename}")
    etag = (meta.etag or "").strip('"').lower()
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"
    return Target(filename=filename, key=key, url=url, headers=headers, total=meta.size,
                   sha256=etag if is_sha256(etag) else None)


def _cached_listing(repo: str) -> list[str]:
    """The files of the repo's cached snapshot (main), for the :TAG form offline."""
    from huggingface_hub import constants

    root = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    try:
        commit = (root / "refs" / "main").read_text().strip()
    except OSError:
        return []
    snap = root / "snapshots" / commit
    return sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())


def _resolve_url(req: m.FetchRequest, src: ParsedSource) -> Target:
    import httpx

    from corral.store.fetch_http import open_url

    url, filename = src.url, src.filename
    assert url is not None and filename is not None
    headers = {"Accept-Encoding": "identity", "User-Agent": "corral"}
    policy = parse_setting(req.allow_private)

    def head() -> int | None:
        try:
            with httpx.Client(timeout=req.timeout_s, trust_env=False) as c, \
                    open_url(c, "HEAD", url, headers, policy) as r:
                status, length = r.status_code, r.headers.get("Content-Length")
        except httpx.HTTPError as exc:
            raise Retryable(f"cannot reach {host_of(url)}: {exc}") from exc
        if status in (405, 501):
            return None  # no HEAD: the size comes with the GET
        raise_for_status(status, url)
        return int(length) if length and length.isdigit() else None

    total = _with_retries(req, head, redact_url(url))
    return Target(filename=filename, key=f"url:{url}", url=url, headers=headers, total=total, guarded=True)


def raise_for_status(status: int, url: str) -> None:
    if status < 300:
        return
    if status in (401, 403):
        hint = ("it is gated or private; set HF_TOKEN to a token that can read it"
                if "/resolve/" in url else "the server wants credentials")
        raise Fail("unauthorized", f"access denied (HTTP {status}) for {redact_url(url)}: {hint}")
    if status == 404:
        raise Fail("not_found", f"file not found (HTTP 404): {redact_url(url)}")
    if status >= 500 or status == 429:
        raise Retryable(f"{host_of(url)} answered HTTP {status}")
    raise Fail("internal", f"{host_of(url)} answered HTTP {status} for {redact_url(url)}")


def host_of(url: str) -> str:
    """host[:port] of a URL (never its user and password)."""
    from urllib.parse import urlsplit

    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[2] if netloc else redact_url(url)


# ---------------------------------------------------------------------- transfer


def resolve(req: m.FetchRequest) -> tuple[ParsedSource, Target]:
    try:
        src = parse_source(req.source)
    except SourceError as exc:
        raise Fail("invalid", str(exc)) from exc
    return src, (_resolve_url(req, src) if src.kind == "url" else _resolve_hub(req, src))
