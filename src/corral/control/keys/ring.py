"""The keys the router accepts, kept current with the keys file.

``KeyRing`` holds the parsed keys file (``corral.config.keys_file``) as a map from the
secret's sha256 digest to a ``Key``, plus the one admin key of ``[server] api_key``
(named ``api_key``). ``authenticate`` hashes what a request presents and looks the
digest up: the secret is never stored, and every stored digest is compared with
``hmac.compare_digest`` (constant time in content and length).

The file is re-read when it changes (its inode, size or mtime differ from the last
read: checked on every authentication, so a removed or rotated key is refused from
the very next request; requests already running finish) and on ``reload`` (SIGHUP,
``POST /models/reload``). A file that does not parse changes nothing: the old keys
stay, the error is logged and published as ``keys_reload_failed``, and the file is read
again every ``RETRY_S`` (and on any change of its owner, mode or ctime, not only its mtime:
a ``chown`` back makes it readable again without a SIGHUP).

Auth is required when either ``api_key`` or ``keys_file`` is set (a keys file with no
keys refuses everyone but ``/health`` and the page). Without both, every request is
the anonymous caller ``-`` with every scope and no limits.

``CALLER`` (a context variable the guard sets per request) carries the request's
``Caller``: the control plane reads it to hide models (``sees``) and to count usage.
"""

from __future__ import annotations

import contextvars
import fnmatch
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from corral.errors import ConfigError
from corral.events import EventBus, EventName
from corral.config.keys_file import SCOPES, KeySpec, read_keys

__all__ = [
    "ANONYMOUS",
    "API_KEY_NAME",
    "CALLER",
    "Caller",
    "Key",
    "KeyRing",
    "current_caller",
    "detached_context",
]

log = logging.getLogger("corral.keys")

RETRY_S = 1.0  # a keys file that could not be read or parsed is read again this often
API_KEY_NAME = "api_key"
ANONYMOUS_NAME = "-"


class Key:
    """A key as the router uses it: name, scopes, model patterns, limits."""

    __slots__ = ("name", "patterns", "scopes", "spec")

    def __init__(self, name: str, spec: KeySpec) -> None:
        self.name = name
        self.spec = spec
        self.scopes = frozenset(SCOPES) if "admin" in spec.scopes else frozenset(spec.scopes)
        self.patterns = spec.models

    def allows(self, scope: str) -> bool:
        return scope in self.scopes

    def sees(self, model_id: str, aliases: Iterable[str] = ()) -> bool:
        """Whether this key may use (and see) the model: a pattern matches its id or an alias."""
        if not self.patterns:
            return True
        names = (model_id, *aliases)
        return any(fnmatch.fnmatchcase(n, p) for p in self.patterns for n in names)

    @property
    def limited(self) -> bool:
        s = self.spec
        return any(v is not None for v in (s.rpm, s.tpm, s.tpd, s.concurrency, s.queue))


ANONYMOUS = Key(ANONYMOUS_NAME, KeySpec(hash="", scopes=("admin",), max_priority=2**31 - 1))


class Caller:
    """One request's key, which models its usage already counted a request for, and the
    ``priority`` its body asked for (0 when none; the fair queue orders by it)."""

    __slots__ = ("counted", "key", "priority")

    def __init__(self, key: Key) -> None:
        self.key = key
        self.counted: set[str] = set()
        self.priority = 0

    @property
    def name(self) -> str:
        return self.key.name


CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("corral_caller", default=None)


def current_caller() -> Caller | None:
    return CALLER.get()


def detached_context() -> contextvars.Context:
    """A copy of the current context without the caller: for work the plane does on its
    own account (background loads, reloads) that a request merely started."""
    ctx = contextvars.copy_context()
    ctx.run(CALLER.set, None)
    return ctx


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


class KeyRing:
    def __init__(self, path: Callable[[], Path | None], api_key: Callable[[], str | None],
                 bus: EventBus) -> None:
        self._path = path
        self._api_key = api_key
        self._bus = bus
        self._keys: dict[bytes, Key] = {}
        self._by_name: dict[str, Key] = {}
        self._seen: tuple[object, ...] | None = None  # path, inode, size, mtime, ctime, owner, mode
        self._failed_at: float | None = None  # when the last read failed (retried every RETRY_S)
        self.last_error: str | None = None
        self._admin_digest: bytes | None = None
        self._admin_key: Key | None = None
        self.refresh(force=True)

    # ------------------------------------------------------------------ reading

    def _stamp(self, path: Path) -> tuple[object, ...]:
        """What changes when the file does: a chown or chmod (ctime, owner, mode) too."""
        try:
            st = os.stat(path)
        except OSError:
            return (str(path), 0, -1, 0)
        return (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_gid,
                st.st_mode)

    def refresh(self, *, force: bool = False, why: str = "changed") -> None:
        """Re-read the keys file if it changed (or ``force``)."""
        path = self._path()
        if path is None:
            if self._by_name or self._seen is not None:
                self._install({}, None, why)
            return
        stamp = self._stamp(path)
        retry = self._failed_at is not None and time.monotonic() - self._failed_at >= RETRY_S
        if not force and stamp == self._seen and not retry:
            return
        self._seen = stamp
        try:
            specs = read_keys(path)
        except ConfigError as exc:
            self._failed_at = time.monotonic()
            self.last_error = exc.message
            log.error("keys file %s: %s; the previous keys stay", path, exc.message)
            self._bus.publish(EventName.KEYS_RELOAD_FAILED, None, reason=exc.message)
            return
        self._install(specs, stamp, why)

    def _install(self, specs: dict[str, KeySpec], stamp: tuple[object, ...] | None, why: str) -> None:
        old = set(self._by_name)
        keys = {name: Key(name, spec) for name, spec in specs.items()}
        by_digest = {bytes.fromhex(k.spec.hash.removeprefix("sha256:")): k for k in keys.values()}
        self._keys, self._by_name, self._seen = by_digest, keys, stamp
        self._failed_at = None
        self.last_error = None
        if stamp is not None or old:
            added, removed = sorted(set(keys) - old), sorted(old - set(keys))
            log.info("keys file %s (%s): %d keys", stamp[0] if stamp else "-", why, len(keys))
            self._bus.publish(EventName.KEYS_RELOADED, None, keys=len(keys), added=added, removed=removed)

    def reload(self, why: str = "SIGHUP") -> None:
        self.refresh(force=True, why=why)

    # ------------------------------------------------------------------ asking

    @property
    def required(self) -> bool:
        """Whether requests must present a key."""
        return bool(self._api_key()) or self._path() is not None

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> Key | None:
        if name == API_KEY_NAME:
            return self._admin()
        return self._by_name.get(name)

    def _admin(self) -> Key | None:
        secret = self._api_key()
        if not secret:
            return None
        digest = _digest(secret.encode())
        if digest != self._admin_digest:
            self._admin_digest = digest
            self._admin_key = Key(API_KEY_NAME, KeySpec(hash="", scopes=("admin",), max_priority=2**31 - 1))
        return self._admin_key

    def authenticate(self, presented: list[bytes]) -> Key | None:
        """The key one of ``presented`` is the secret of; None when none is. Without auth
        configured: the anonymous key."""
        if not self.required:
            return ANONYMOUS
        self.refresh()
        found: Key | None = None
        admin = self._admin()
        for secret in presented:
            digest = _digest(secret)
            if admin is not None and self._admin_digest is not None \
                    and hmac.compare_digest(digest, self._admin_digest):
                found = found or admin
            key = self._keys.get(digest)
            # the dict lookup found a candidate by its digest; compare_digest confirms it
            # (constant time; the digest of a guess says nothing about the secret)
            if key is not None and hmac.compare_digest(digest, bytes.fromhex(key.spec.hash[7:])):
                found = found or key
        return found
