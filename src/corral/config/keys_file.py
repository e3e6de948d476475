"""The keys file: who may call the router, with what scopes, models and limits.

One TOML file (``[server] keys_file``), one table per key, written by ``corral keys``::

    [keys.alice]
    hash = "sha256:9f86d0..."      # sha256 of the secret; the secret itself is never stored
    prefix = "crl_Ab3d"            # the secret's first characters, to tell keys apart
    scopes = ["infer"]             # infer, manage (load/unload/pull/reload), admin (all)
    models = ["gemma-*", "qwen3"]  # ids, aliases or glob patterns; [] or absent: every model
    rpm = 60                       # requests per minute
    tpm = 100000                   # tokens (prompt + completion) per minute
    tpd = 2000000                  # tokens per day (UTC)
    concurrency = 4                # requests in flight
    queue = 8                      # requests waiting for one of those (absent: no bound)
    weight = 1.0                   # fair share (stored; used by the scheduler to come)
    max_priority = 0               # the highest ``priority`` a request may ask for
    cache_group = "team-a"         # share the prompt cache with the group's keys (absent: the key's own)
    created = "2026-12-01T10:00:00Z"

Absent limits are unlimited. Parsing is strict (an unknown key is an error naming the
table) and returns every key or raises ``ConfigError``: a half-valid file changes
nothing. Writes are atomic (a temporary file in the same directory, fsync, rename), so
a reader (the router re-reads the file when it changes) never sees half a file.

This module is shared by the router (``corral.control.keys.ring``) and the CLI, so it
imports nothing from either.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from corral.errors import ConfigError

__all__ = [
    "RESERVED_NAMES",
    "SCOPES",
    "KeySpec",
    "hash_secret",
    "name_problem",
    "new_secret",
    "now_iso",
    "owner_and_mode",
    "parse_keys",
    "read_keys",
    "render_keys",
    "write_keys",
    "locked_keys",
]

SCOPES = ("infer", "manage", "admin")
RESERVED_NAMES = frozenset({"api_key", "-"})  # the [server] api_key; anonymous (no keys at all)
SECRET_PREFIX = "crl_"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_LIMITS = ("rpm", "tpm", "tpd", "concurrency", "queue")


class KeySpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One key as the file holds it (the hash, never the secret)."""

    hash: str
    prefix: str = ""
    scopes: tuple[str, ...] = ("infer",)
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    tpd: int | None = None
    concurrency: int | None = None
    queue: int | None = None
    weight: float = 1.0
    max_priority: int = 0
    cache_group: str | None = None  # keys of one group share their prompt cache (control/keys/cache_tenant.py)
    created: str = ""


def name_problem(name: str) -> str | None:
    if name in RESERVED_NAMES:
        return f"{name!r} is reserved"
    if not _NAME_RE.fullmatch(name):  # fullmatch: '$' would let a trailing newline through
        return "a key name is 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"
    return None


def hash_secret(secret: str | bytes) -> str:
    raw = secret.encode() if isinstance(secret, str) else secret
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def new_secret() -> str:
    """A fresh secret: 32 random bytes (256 bits), URL-safe, with a recognizable prefix."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def _problem(spec: KeySpec) -> str | None:
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", spec.hash):
        return "hash must be 'sha256:' and 64 hex digits"
    bad = [s for s in spec.scopes if s not in SCOPES]
    if bad:
        return f"unknown scope {bad[0]!r} (scopes: {', '.join(SCOPES)})"
    for field in _LIMITS:
        v = getattr(spec, field)
        if v is not None and v < (0 if field == "queue" else 1):
            return f"{field} must be {'>= 0' if field == 'queue' else '>= 1'}"
    if not spec.weight > 0:
        return "weight must be > 0"
    if any(not p for p in spec.models):
        return "models: an empty pattern"
    if spec.cache_group is not None and not _NAME_RE.match(spec.cache_group):
        return "cache_group: 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"
    return None


def parse_keys(text: str, source: str = "keys file") -> dict[str, KeySpec]:
    """Every key in ``text``; ConfigError naming the table and field at fault."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    unknown = [k for k in doc if k != "keys"]
    if unknown:
        raise ConfigError(f"{source}: unknown table {unknown[0]!r} (only [keys.NAME] tables)")
    tables = doc.get("keys", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{source}: 'keys' must be a table of [keys.NAME] tables")
    out: dict[str, KeySpec] = {}
    seen_hashes: dict[str, str] = {}
    for name, table in tables.items():
        where = f"{source}: [keys.{name}]"
        problem = name_problem(name)
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        try:
            spec = msgspec.convert(table, KeySpec, strict=True)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        problem = _problem(spec)
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        if spec.hash in seen_hashes:
            raise ConfigError(f"{where}: the same secret as [keys.{seen_hashes[spec.hash]}]")
        seen_hashes[spec.hash] = name
        out[name] = spec
    return out


def read_keys(path: Path) -> dict[str, KeySpec]:
    """The keys in ``path``; a missing file holds none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the keys file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: the keys file is not UTF-8 text (byte {exc.start})") from None
    try:
        return parse_keys(text, str(path))
    except RecursionError:
        raise ConfigError(f"{path}: the keys file nests too deep to be a keys file") from None


def _toml(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)  # strings (JSON escapes are TOML's), numbers


def render_keys(keys: dict[str, KeySpec]) -> str:
    lines = ["# corral keys file, written by `corral keys`. Secrets are stored as sha256 hashes.", ""]
    for name in sorted(keys):
        spec = keys[name]
        lines.append(f"[keys.{json.dumps(name)}]")
        for field in spec.__struct_fields__:
            value = getattr(spec, field)
            if value is None or (field in ("prefix", "created") and not value):
                continue
            lines.append(f"{field} = {_toml(value)}")
        lines.append("")
    return "\n".join(lines)


def owner_and_mode(path: Path) -> tuple[int, int, int]:
    """(uid, gid, mode) the rewritten file must have: the existing file's, so a server that
    reads it as its owner still can; a new file: 0600, owned like its directory."""
    try:
        st = os.stat(path)
        return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)
    except FileNotFoundError:
        st = os.stat(path.parent)
        return st.st_uid, st.st_gid, 0o600


def write_keys(path: Path, keys: dict[str, KeySpec]) -> None:
    """Atomically replace ``path``: a temporary file in its directory (created 0600), given
    the original's owner, group and mode (a new file: 0600, its directory's owner), fsync,
    rename. ConfigError, and the file untouched, when the owner cannot be kept (not root)."""
    text = render_keys(keys)
    parse_keys(text, str(path))  # what is written reads back
    path.parent.mkdir(parents=True, exist_ok=True)
    uid, gid, mode = owner_and_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            try:
                if (uid, gid) != (os.geteuid(), os.getegid()):
                    os.fchown(f.fileno(), uid, gid)
            except PermissionError:
                raise ConfigError(f"{path}: cannot keep the keys file's owner (uid {uid}, gid {gid}); "
                                  "run `corral keys` as that user or as root") from None
            os.fchmod(f.fileno(), mode)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself, durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _lock_file(path: Path) -> int:
    """The keys file's lock (``PATH.lock``) opened for flock (read-only: a lock needs no write).
    Made 0600 whatever the umask and owned like the keys file, so the server's user keeps it;
    one already there keeps its owner and mode."""
    lock = path.with_name(path.name + ".lock")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return os.open(lock, flags)
    except OSError as exc:
        raise ConfigError(f"{lock}: cannot open the keys file's lock ({exc.strerror}); "
                          "run `corral keys` as the keys file's owner or as root") from None
    uid, gid, _ = owner_and_mode(path)
    try:
        if (uid, gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, uid, gid)
    except PermissionError:
        os.close(fd)
        os.unlink(lock)
        raise ConfigError(f"{path}: cannot keep the keys file's owner (uid {uid}, gid {gid}); "
                          "run `corral keys` as that user or as root") from None
    return fd


@contextlib.contextmanager
def locked_keys(path: Path) -> Iterator[dict[str, KeySpec]]:
    """The file's keys under an exclusive lock (``PATH.lock``); what the body leaves in the
    dict is written (``write_keys``). `corral keys` and the router's key routes
    (api/manage/keys.py) edit the file through it. ConfigError when the file is unreadable,
    the lock cannot be taken or the owner cannot be kept."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(_lock_file(path)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            keys = read_keys(path)
        except ConfigError as exc:
            raise ConfigError(f"{exc.message}; fix the file first") from None
        before = dict(keys)
        yield keys
        if keys != before:
            write_keys(path, keys)


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

