"""A local stand-in for the Hugging Face Hub (and any http server), for tests.

Speaks what huggingface_hub 2.x and corral's fetch child use:
    HEAD/GET /{owner}/{repo}/resolve/{revision}/{path}   file bytes + Hub headers, Range
    GET      /api/models/{owner}/{repo}/tree/{revision}  the file listing (``:TAG`` form)
    HEAD/GET /plain/{name}                                 a plain file (URL sources)
    GET      /api/models?search=TEXT&filter=gguf...        the search (list_models): repos with a
                                                           .gguf whose name holds TEXT

Each file has a ``Behavior`` the test can change: cut the connection after N bytes
(for the first ``cut_times`` GETs), serve wrong bytes, throttle, answer a status
(404/401/500...) to HEAD or GET, ignore Range. Every request is recorded.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Behavior:
    cut_after: int | None = None  # close the connection after this many body bytes
    cut_times: int = 1  # ... for this many GETs
    wrong_bytes: bool = False  # flip the bytes (the announced sha256 stays right)
    bytes_per_s: float | None = None  # throttle
    head_status: int | None = None
    get_status: int | None = None  # for every GET (e.g. 500)
    get_status_times: int | None = None  # ... only the first N GETs
    ignore_range: bool = False
    gated: bool = False  # 401 with X-Error-Code: GatedRepo
    head_delay_s: float = 0.0  # a slow metadata answer
    head_arrived: threading.Event = field(default_factory=threading.Event)  # set by the first HEAD


@dataclass
class HubFile:
    data: bytes | None = None
    path: Path | None = None  # serve a file from disk (large)
    size: int = 0
    sha256: str = ""
    behavior: Behavior = field(default_factory=Behavior)
    gets: int = 0
    key: str = ""

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        assert self.path is not None
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class Request:
    method: str
    path: str
    range_start: int | None
    auth: str | None


@dataclass
class RepoMeta:
    """What the search says of a repo besides its files."""

    downloads: int = 0
    likes: int = 0
    license: str | None = None
    last_modified: str = "2026-11-01T12:00:00.000Z"


@dataclass
class SearchBehavior:
    status: int | None = None  # answer the search (and tree listings) with this status
    delay_s: float = 0.0  # a slow Hub: wait this long before answering a search or listing
    released: threading.Event = field(default_factory=threading.Event)  # set: stop waiting at once


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[str, HubFile] = {}  # "owner/repo/path" or "plain/name"
        self.repos: dict[str, RepoMeta] = {}  # "owner/repo" -> search metadata
        self.search = SearchBehavior()
        self.bytes_served: dict[str, int] = {}  # file key -> body bytes sent
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, head=True)

            def do_GET(self) -> None:
                hub._serve(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ------------------------------------------------------------------ setup
    def add(self, key: str, data: bytes | None = None, *, path: Path | None = None,
            sha256: str | None = None) -> HubFile:
        if data is not None:
            f = HubFile(data=data, size=len(data), sha256=sha256 or hashlib.sha256(data).hexdigest())
        else:
            assert path is not None and sha256 is not None
            f = HubFile(path=path, size=path.stat().st_size, sha256=sha256)
        f.key = key
        self.files[key] = f
        return f

    def range_starts(self, key: str) -> list[int | None]:
        return [r.range_start for r in self.requests
                if r.method == "GET" and r.path.endswith("/" + key.split("/", 2)[-1])]

    # ------------------------------------------------------------------ serving
    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        rng = h.headers.get("Range")
        rm = re.match(r"bytes=(\d+)-(\d*)", rng) if rng else None
        start = int(rm.group(1)) if rm else None
        last = int(rm.group(2)) if rm and rm.group(2) else None  # bytes=a-b: b included
        with self._lock:
            self.requests.append(Request(h.command, path, start, h.headers.get("Authorization")))
        if path == "/api/models" or (m := re.match(r"^/api/models/([^/]+/[^/]+)/tree/[^/]+", path)):
            if self.search.delay_s:
                self.search.released.wait(self.search.delay_s)
            if self.search.status:
                return self._status(h, self.search.status)
            if path == "/api/models":
                return self._search(h, h.path)
            return self._tree(h, m.group(1))
        if (m := re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)):
            key = f"{m.group(1)}/{m.group(2)}"
        elif path.startswith("/plain/"):
            key = path[1:]
        else:
            return self._status(h, 404, "RepoNotFound")
        f = self.files.get(key)
        if f is None:
            return self._status(h, 404, "EntryNotFound" if key.count("/") > 1 else "RepoNotFound")
        b = f.behavior
        if b.gated:
            return self._status(h, 401, "GatedRepo")
        if head:
            b.head_arrived.set()
        if head and b.head_delay_s:
            time.sleep(b.head_delay_s)
        if head and b.head_status:
            return self._status(h, b.head_status)
        if not head:
            with self._lock:
                f.gets += 1
                n = f.gets
            if b.get_status and (b.get_status_times is None or n <= b.get_status_times):
                return self._status(h, b.get_status)
        partial = start is not None and not b.ignore_range and not head
        if partial and start >= f.size:  # type: ignore[operator]
            h.send_response(416)
            h.send_header("Content-Range", f"bytes */{f.size}")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        begin = start if partial else 0
        end = min(f.size, last + 1) if partial and last is not None else f.size
        h.send_response(206 if partial else 200)
        h.send_header("Content-Length", str(end - begin))  # type: ignore[operator]
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("ETag", f'"{f.sha256}"')
        h.send_header("X-Linked-Etag", f'"{f.sha256}"')
        h.send_header("X-Linked-Size", str(f.size))
        if partial:
            h.send_header("Content-Range", f"bytes {begin}-{end - 1}/{f.size}")
        h.end_headers()
        if head:
            return
        cut = b.cut_after if b.cut_after is not None and n <= b.cut_times else None
        self._body(h, f, begin, cut, end)  # type: ignore[arg-type]

    def _body(self, h: BaseHTTPRequestHandler, f: HubFile, begin: int, cut: int | None, end: int) -> None:
        pos, sent = begin, 0
        chunk = 16 * 1024 if f.behavior.bytes_per_s else 256 * 1024
        t0 = time.monotonic()
        try:
            while pos < end:
                n = min(chunk, end - pos)
                if cut is not None:
                    n = min(n, cut - sent)
                    if n <= 0:
                        break
                data = f.read(pos, pos + n)
                if f.behavior.wrong_bytes:
                    data = bytes(x ^ 0xFF for x in data)
                h.wfile.write(data)
                pos += n
                sent += n
                with self._lock:
                    self.bytes_served[f.key] = self.bytes_served.get(f.key, 0) + n
                if f.behavior.bytes_per_s:
                    ahead = sent / f.behavior.bytes_per_s - (time.monotonic() - t0)
                    if ahead > 0:
                        time.sleep(ahead)
            h.wfile.flush()
            if cut is not None and pos < end:
                h.connection.shutdown(socket.SHUT_RDWR)  # drop it mid-file
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # the client went away (cancel)

    def _tree(self, h: BaseHTTPRequestHandler, repo: str) -> None:
        entries = [
            {"type": "file", "oid": hashlib.sha1(k.encode()).hexdigest(), "size": f.size,
             "path": k[len(repo) + 1:],
             "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
            for k, f in self.files.items() if k.startswith(repo + "/")
        ]
        if not entries:
            return self._status(h, 404, "RepoNotFound")
        body = json.dumps(entries).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _search(self, h: BaseHTTPRequestHandler, raw: str) -> None:
        from urllib.parse import parse_qs, urlsplit

        q = parse_qs(urlsplit(raw).query)
        text = (q.get("search") or [""])[0].lower()
        limit = int((q.get("limit") or ["1000"])[0])
        repos: dict[str, list[str]] = {}
        for k in self.files:
            if not k.startswith("plain/"):
                owner, name, rest = k.split("/", 2)
                repos.setdefault(f"{owner}/{name}", []).append(rest)
        out = []
        for repo, files in repos.items():
            if text not in repo.lower() or not any(f.lower().endswith(".gguf") for f in files):
                continue
            meta = self.repos.get(repo, RepoMeta())
            out.append({"id": repo, "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
                        "downloads": meta.downloads, "likes": meta.likes, "lastModified": meta.last_modified,
                        "tags": ["gguf", *([f"license:{meta.license}"] if meta.license else [])],
                        "siblings": [{"rfilename": f} for f in sorted(files)]})
        out.sort(key=lambda e: -int(e["downloads"]))  # type: ignore[call-overload]
        body = json.dumps(out[:limit]).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _status(self, h: BaseHTTPRequestHandler, status: int, error_code: str | None = None) -> None:
        body = json.dumps({"error": f"fake hub says {status}"}).encode()
        h.send_response(status)
        if error_code:
            h.send_header("X-Error-Code", error_code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)
