"""Whose prompt cache a request may reuse: the cache tenant, computed here and nowhere else.

    msg = with_tenant(msg, current_caller(), cache_salt)   # ControlPlane.generate, every generation

A worker reuses a slot's cached prefix, and restores a saved prefix (RAM, disk, a slot file,
a paused request's state), only for a request of the same tenant
(``wire.GenerateRequest.cache_tenant``), so the cached-token counts every dialect reports
(and the first token's time) say nothing about another tenant's prompts.

The rule (docs/internals/prompt-cache.md, "Tenants"):

- a key's tenant is its name, or its keys-file ``cache_group`` (keys that share system
  prompts on purpose); the ``[server] api_key`` is the key ``api_key``;
- the anonymous caller of a server without keys (``-``), and work without a caller, is the
  one tenant ``""``: a single user's cache is as before;
- a request's ``cache_salt`` (vLLM's and llama-server's name; OpenAI chat, completions,
  Responses) splits its tenant further: the same salt, and only it, shares.

The worker gets a digest (sha256, 32 hex digits), never a key's secret or name.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import msgspec

from corral import wire
from corral.control.keys.ring import ANONYMOUS_NAME, Caller

__all__ = ["affinity_prefix", "tenant_of", "with_tenant"]


@lru_cache(maxsize=4096)
def _digest(owner: str, salt: str | None) -> str:
    h = hashlib.sha256(b"corral-cache-tenant-1\0" + owner.encode())
    if salt is not None:
        h.update(b"\0salt\0" + salt.encode())
    return h.hexdigest()[:32]


def tenant_of(caller: Caller | None, cache_salt: str | None = None) -> str:
    """The cache tenant of a request from ``caller`` with ``cache_salt`` ("" for the one
    tenant of a server without keys, without a salt)."""
    if caller is None or caller.name == ANONYMOUS_NAME:
        owner = ""
    elif caller.key.spec.cache_group is not None:
        owner = "group:" + caller.key.spec.cache_group  # apart from any key's name
    else:
        owner = "key:" + caller.name
    if not owner and cache_salt is None:
        return ""
    return _digest(owner, cache_salt)


def with_tenant(msg: wire.GenerateRequest, caller: Caller | None, cache_salt: str | None) -> wire.GenerateRequest:
    """``msg`` with its ``cache_tenant`` set (whatever it held before is replaced)."""
    tenant = tenant_of(caller, cache_salt)
    return msg if msg.cache_tenant == tenant else msgspec.structs.replace(msg, cache_tenant=tenant)


def affinity_prefix(msg: wire.GenerateRequest, prefix: str | None) -> str | None:
    """The balancer's prompt prefix for ``msg``: its tenant first, so that an instance counts
    as holding the prefix only for the tenant whose requests sent it there (another tenant's
    would not be served it, and the pick would say which instance holds whose prompts)."""
    if prefix is None or not msg.cache_tenant:
        return prefix
    return msg.cache_tenant + "\0" + prefix
