"""A GGUF header read over HTTP with range requests: what the fit estimate of a file on the
Hub needs (``corral.fit.layout.layout_of``), without downloading the file.

``RemoteHeaders.layout(repo, files, revision)`` reads the first ``FIRST_READ`` bytes of each
part (``bytes=0-…``), and, while the header does not parse from what it has, the next
stretch (doubling), up to ``MAX_HEADER_BYTES``: a header claiming more than that (a
vocabulary of millions, a tensor count that lies) is refused, never read on. A server that
ignores ``Range`` is read only as far as asked, then the connection is closed. The file's
size comes from ``Content-Range`` (or ``Content-Length``).

The bytes read are kept, per repo, commit and file, in ``models_dir/.corral/headers/``
(``HEADER_CACHE_FILES`` of them and ``HEADER_CACHE_BYTES`` at most, the oldest dropped), and
parsed with the one GGUF reader, ``corral.model.gguf_header.read_header``; the layouts in
memory (an LRU of ``LAYOUT_CACHE``), with the refusals (a file that is not a GGUF we can plan
with is not read again; a Hub that failed is asked again). Requests go where pulls go: ``HF_ENDPOINT``, with ``HF_TOKEN``'s token
(huggingface_hub's ``hf_hub_url`` and ``build_hf_headers``). Synchronous (httpx): the router
calls it in a thread (``corral.api.page.hub``).
"""

from __future__ import annotations

import collections
import hashlib
import os
import threading
from pathlib import Path

import httpx

from corral.fit.layout import ModelLayout, layout_of
from corral.model.gguf_header import GGUFError, GGUFHeader, read_header
from corral.state.paths import private_dir

__all__ = ["RemoteHeaders", "RemoteHeaderError", "FIRST_READ", "MAX_HEADER_BYTES"]

FIRST_READ = 256 * 1024
MAX_HEADER_BYTES = 16 * 1024 * 1024
HEADER_CACHE_FILES = 128
HEADER_CACHE_BYTES = 256 * 1024 * 1024  # on disk, all kept headers together
LAYOUT_CACHE = 256  # layouts and refusals (a file that is no GGUF we can plan with) in memory
_TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class RemoteHeaderError(Exception):
    """The header could not be read: the Hub's answer, or a file that is not a GGUF we can
    plan with. ``str()`` says which, for the page; ``reach``: the Hub failed (unreachable, too
    slow, 5xx), not the file."""

    def __init__(self, message: str, *, reach: bool = False) -> None:
        super().__init__(message)
        self.reach = reach


class RemoteHeaders:
    def __init__(self, cache_dir: Path, *, timeout: httpx.Timeout = _TIMEOUT) -> None:
        self._dir = cache_dir
        self._timeout = timeout
        self._layouts: collections.OrderedDict[str, ModelLayout | str] = collections.OrderedDict()
        self._lock = threading.Lock()
        # one reader of a cached file at a time (two requests for one quantization): a fixed
        # set of locks, picked by the file's name, so their number stays bounded
        self._file_locks = [threading.Lock() for _ in range(16)]

    def layout(self, repo: str, files: list[str], revision: str | None = None) -> ModelLayout:
        """The layout of ``files`` (one, or a split model's parts in order) of ``repo``."""
        key = hashlib.sha256(f"{repo}\0{revision}\0{chr(0).join(files)}".encode()).hexdigest()
        with self._lock:
            hit = self._layouts.get(key)
            if hit is not None:
                self._layouts.move_to_end(key)
        if isinstance(hit, str):  # refused before: not read again (a lying header costs its 16 MiB once)
            raise RemoteHeaderError(hit)
        if hit is not None:
            return hit
        try:
            headers = [self.header(repo, f, revision) for f in files]
            lo: ModelLayout | str = layout_of(headers[0], *headers[1:], where=f"{repo}/{files[0]}")
        except GGUFError as exc:
            lo = f"{repo}/{files[0]}: {exc}"
        except RemoteHeaderError as exc:
            if exc.reach:
                raise  # the Hub's fault, not the file's: asked again next time
            lo = str(exc)
        with self._lock:
            self._layouts[key] = lo
            while len(self._layouts) > LAYOUT_CACHE:
                self._layouts.popitem(last=False)
        if isinstance(lo, str):
            raise RemoteHeaderError(lo)
        return lo

    def header(self, repo: str, filename: str, revision: str | None = None) -> GGUFHeader:
        """One file's header, its ``file_bytes`` the remote file's size."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        name = hashlib.sha256(f"{repo}\0{revision}\0{filename}".encode()).hexdigest()[:32]
        with self._file_locks[int(name[:4], 16) % len(self._file_locks)]:
            return self._header(hf_hub_url(repo, filename, revision=revision), name, f"{repo}/{filename}",
                                build_hf_headers())

    def _header(self, url: str, name: str, what: str, headers: dict[str, str]) -> GGUFHeader:
        private_dir(self._dir)
        part = self._dir / f"{name}.head"
        size_file = self._dir / f"{name}.size"
        headers["Accept-Encoding"] = "identity"
        have, total = self._cached(part, size_file)
        with httpx.Client(timeout=self._timeout, follow_redirects=True) as client:
            while True:
                if have > 0 and total is not None:
                    try:
                        h = read_header(part, file_size=total)
                    except GGUFError as exc:
                        if have >= min(total, MAX_HEADER_BYTES):
                            if have >= total:
                                raise RemoteHeaderError(f"{what}: {exc}") from None
                            raise RemoteHeaderError(
                                f"{what}: its GGUF header does not end within the first "
                                f"{MAX_HEADER_BYTES // 2**20} MiB ({exc}); not read further") from None
                    except OSError as exc:
                        raise RemoteHeaderError(f"{what}: cannot keep its header: {exc}") from None
                    else:
                        return h
                want = min(max(FIRST_READ, have * 2), MAX_HEADER_BYTES) - have
                chunk, total = self._get(client, url, headers, have, want, what)
                if not chunk:
                    raise RemoteHeaderError(f"{what}: the Hub sent no bytes at offset {have}")
                mode = "r+b" if have else "wb"
                fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
                os.close(fd)
                with open(part, mode) as f:
                    f.seek(have)
                    f.write(chunk)
                    f.truncate()
                have += len(chunk)
                size_file.write_text(str(total))
                self._trim()

    def size(self, repo: str, filename: str, revision: str | None = None) -> int:
        """A file's size from a HEAD request (a projector's, which sits on the first GPU beside
        the layers): the Hub's ``X-Linked-Size`` for a large file, else ``Content-Length``."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        what = f"{repo}/{filename}"
        headers = build_hf_headers()
        headers["Accept-Encoding"] = "identity"
        try:
            with httpx.Client(timeout=self._timeout, follow_redirects=False) as client:
                r = client.head(hf_hub_url(repo, filename, revision=revision), headers=headers)
        except httpx.TimeoutException:
            raise RemoteHeaderError(f"{what}: the Hub did not answer in time", reach=True) from None
        except httpx.HTTPError as exc:
            raise RemoteHeaderError(f"{what}: cannot reach the Hub ({type(exc).__name__})", reach=True) from None
        if r.status_code == 404:
            raise RemoteHeaderError(f"{what}: not found on the Hub (HTTP 404)")
        if r.status_code >= 400:
            raise RemoteHeaderError(f"{what}: the Hub answered HTTP {r.status_code}",
                                    reach=r.status_code >= 500 or r.status_code == 429)
        for h in ("X-Linked-Size", "Content-Length"):
            v = r.headers.get(h, "")
            if v.isdigit():
                return int(v)
        raise RemoteHeaderError(f"{what}: the Hub did not say its size")

    def _cached(self, part: Path, size_file: Path) -> tuple[int, int | None]:
        try:
            return part.stat().st_size, int(size_file.read_text())
        except (OSError, ValueError):
            return 0, None

    def _get(self, client: httpx.Client, url: str, headers: dict[str, str], start: int, n: int,
             what: str) -> tuple[bytes, int]:
        """Bytes ``start`` .. ``start + n - 1`` of ``url`` (fewer at its end) and its size."""
        h = dict(headers, Range=f"bytes={start}-{start + n - 1}")
        try:
            with client.stream("GET", url, headers=h) as r:
                if r.status_code in (401, 403):
                    raise RemoteHeaderError(f"{what}: the Hub refused it (HTTP {r.status_code}): gated or "
                                            "private; set HF_TOKEN to a token that can read it")
                if r.status_code == 404:
                    raise RemoteHeaderError(f"{what}: not found on the Hub (HTTP 404)")
                if r.status_code == 416:
                    raise RemoteHeaderError(f"{what}: the file ends before its GGUF header does")
                if r.status_code not in (200, 206):
                    raise RemoteHeaderError(f"{what}: the Hub answered HTTP {r.status_code}",
                                            reach=r.status_code >= 500 or r.status_code == 429)
                total = _size_of(r, start, what)
                skip = start if r.status_code == 200 else 0  # Range ignored: the file from its start
                out = bytearray()
                for data in r.iter_bytes():
                    if skip:
                        drop = min(skip, len(data))
                        data, skip = data[drop:], skip - drop
                    out += data
                    if len(out) >= n:
                        break  # enough: closing the stream drops the rest
                return bytes(out[:n]), total
        except httpx.TimeoutException:
            raise RemoteHeaderError(f"{what}: the Hub did not answer in time", reach=True) from None
        except httpx.HTTPError as exc:
            raise RemoteHeaderError(f"{what}: cannot reach the Hub ({type(exc).__name__})", reach=True) from None

    def _trim(self) -> None:
        """Keep the newest ``HEADER_CACHE_FILES`` headers, ``HEADER_CACHE_BYTES`` at most."""
        try:
            heads = sorted(self._dir.glob("*.head"), key=lambda p: p.stat().st_mtime_ns)
        except OSError:
            return
        sizes = []
        for p in heads:
            try:
                sizes.append(p.stat().st_size)
            except OSError:
                sizes.append(0)
        total, drop = sum(sizes), max(0, len(heads) - HEADER_CACHE_FILES)
        for k, old in enumerate(heads):
            if k >= drop and total <= HEADER_CACHE_BYTES:
                break
            total -= sizes[k]
            for p in (old, old.with_suffix(".size")):
                try:
                    p.unlink()
                except OSError:
                    pass


def _size_of(r: httpx.Response, start: int, what: str) -> int:
    cr = r.headers.get("Content-Range", "")
    if "/" in cr and cr.rsplit("/", 1)[1].isdigit():
        return int(cr.rsplit("/", 1)[1])
    cl = r.headers.get("Content-Length", "")
    if cl.isdigit():
        return int(cl) + (start if r.status_code == 206 else 0)
    raise RemoteHeaderError(f"{what}: the Hub did not say the file's size")
